"""The e-graph optimiser: equality saturation over pyforge's IR, extraction by branch and bound."""

from .egraph import EGraph, ENode
from .extract import Extraction, SearchLog, branch_and_bound, dag_cost, greedy, must_classes
from .rules import Rule, SaturationReport, ematch, saturate

__all__ = [
    "EGraph",
    "ENode",
    "Extraction",
    "Rule",
    "SaturationReport",
    "SearchLog",
    "branch_and_bound",
    "dag_cost",
    "ematch",
    "greedy",
    "must_classes",
    "saturate",
]

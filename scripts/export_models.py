"""Exports the real-exporter fixtures in tests/models/exported/ (run by hand, not by CI).

Each model kind that issue #21 names is built the way its users build it (torchvision and
transformers models from their configs, or a module written the way the upstream project
writes it), given random weights, and exported with `torch.onnx.export`. The exported graph
is then stripped of its weights: every float initializer of more than STRIP_ABOVE elements
becomes an empty tensor of the same name, type and shape whose doc_string records how to
refill it (`scripts/make_exported_models.py` does, with seeded normal values of the mean and
spread the original had, clipped to its range), so the committed files are small and CI needs neither torch nor the network.
Small initializers (shape vectors, axes, epsilons, the constants of decomposed activations)
are kept verbatim: they are the graph's meaning, not its weights.

The manifest (tests/models/exported/manifest.json) records, per fixture, the exporter and its
version, the export call, the shape pins and how to draw each input.

Usage: python scripts/export_models.py [KIND ...]   (a venv with torch, torchvision,
transformers, onnx and onnxscript; see tests/models/exported/README.md)
"""

import json
import os
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models", "exported")
STRIP_ABOVE = 16
torch.manual_seed(0)


def randomize_norm_stats(model):
    """Gives norms non-trivial statistics and affine terms (a fresh torchvision model has
    mean 0, var 1, weight 1, bias 0, which would hide a wrong fold), and every constant
    parameter random values."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
            m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) * 1.0 + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
        if isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            n = m.weight.numel()
            m.weight.data.copy_(torch.rand(n, generator=g).reshape(m.weight.shape) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=g).reshape(m.bias.shape) * 0.2 - 0.1)
    # Zero-initialized parameters (torchvision's ViT head and class token, the biases of
    # SE convs) would make whole branches vanish from the check.
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


# --- model kinds written the way their projects write them -------------------------------


class ConvBnAct(nn.Sequential):
    def __init__(self, cin, cout, k=1, s=1, act=nn.SiLU):
        super().__init__(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), act())


class DbnetFpn(nn.Module):
    """A DBNet text detector as PaddleOCR's DB (ported to torch by its users) writes it: a
    MobileNetV3-large backbone, an FPN of 1x1 reductions, nearest x2 upsampling and adds,
    3x3 smoothing convs upsampled to 1/4 and concatenated, and the probability head
    (Conv-BN-ReLU, two stride-2 ConvTransposes, Sigmoid)."""

    def __init__(self, inner=96):
        super().__init__()
        f = torchvision.models.mobilenet_v3_large().features
        # stage ends at strides 4, 8, 16, 32
        self.stages = nn.ModuleList([f[:4], f[4:7], f[7:13], f[13:]])
        chans = [24, 40, 112, 960]
        self.ins = nn.ModuleList([nn.Conv2d(c, inner, 1, bias=False) for c in chans])
        self.ps = nn.ModuleList([nn.Conv2d(inner, inner // 4, 3, padding=1, bias=False) for _ in chans])
        q = inner // 4
        self.head = nn.Sequential(
            nn.Conv2d(inner, q, 3, padding=1, bias=False),
            nn.BatchNorm2d(q),
            nn.ReLU(),
            nn.ConvTranspose2d(q, q, 2, 2),
            nn.BatchNorm2d(q),
            nn.ReLU(),
            nn.ConvTranspose2d(q, 1, 2, 2),
            nn.Sigmoid(),
        )

    def forward(self, x):
        feats = []
        for s in self.stages:
            x = s(x)
            feats.append(x)
        c2, c3, c4, c5 = [conv(f) for conv, f in zip(self.ins, feats)]
        up = lambda t: F.interpolate(t, scale_factor=2, mode="nearest")
        o4 = c4 + up(c5)
        o3 = c3 + up(o4)
        o2 = c2 + up(o3)
        p5 = F.interpolate(self.ps[3](c5), scale_factor=8, mode="nearest")
        p4 = F.interpolate(self.ps[2](o4), scale_factor=4, mode="nearest")
        p3 = F.interpolate(self.ps[1](o3), scale_factor=2, mode="nearest")
        p2 = self.ps[0](o2)
        return self.head(torch.cat([p5, p4, p3, p2], dim=1))


class C3(nn.Module):
    """YOLOv5's CSP bottleneck block."""

    def __init__(self, cin, cout, n=1):
        super().__init__()
        h = cout // 2
        self.cv1, self.cv2, self.cv3 = ConvBnAct(cin, h), ConvBnAct(cin, h), ConvBnAct(2 * h, cout)
        self.m = nn.Sequential(*[nn.Sequential(ConvBnAct(h, h), ConvBnAct(h, h, 3)) for _ in range(n)])

    def forward(self, x):
        a = self.cv1(x)
        for b in self.m:
            a = a + b(a)
        return self.cv3(torch.cat([a, self.cv2(x)], 1))


class Sppf(nn.Module):
    """YOLOv5's fast spatial pyramid pooling: three chained 5x5 max pools."""

    def __init__(self, cin, cout):
        super().__init__()
        self.cv1, self.cv2 = ConvBnAct(cin, cin // 2), ConvBnAct(cin * 2, cout)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


class YoloStyle(nn.Module):
    """A YOLOv5-style detector at width 0.25: the Focus stem (space-to-depth by strided
    slices and a concat), Conv+BN+SiLU, C3 blocks, SPPF, an FPN/PAN neck with nearest
    upsampling and concats, and the Detect head with its sigmoid decode against grids
    and anchors, as YOLOv5's export writes it."""

    def __init__(self, nc=80, w=16):
        super().__init__()
        self.focus = ConvBnAct(12, w, 3)
        self.b1 = nn.Sequential(ConvBnAct(w, 2 * w, 3, 2), C3(2 * w, 2 * w))
        self.b2 = nn.Sequential(ConvBnAct(2 * w, 4 * w, 3, 2), C3(4 * w, 4 * w, 2))
        self.b3 = nn.Sequential(ConvBnAct(4 * w, 8 * w, 3, 2), C3(8 * w, 8 * w, 2))
        self.b4 = nn.Sequential(ConvBnAct(8 * w, 16 * w, 3, 2), C3(16 * w, 16 * w), Sppf(16 * w, 16 * w))
        self.lat4 = ConvBnAct(16 * w, 8 * w)
        self.n4 = C3(16 * w, 8 * w)
        self.lat3 = ConvBnAct(8 * w, 4 * w)
        self.n3 = C3(8 * w, 4 * w)
        self.down3 = ConvBnAct(4 * w, 4 * w, 3, 2)
        self.p4 = C3(8 * w, 8 * w)
        self.down4 = ConvBnAct(8 * w, 8 * w, 3, 2)
        self.p5 = C3(16 * w, 16 * w)
        self.no, self.na = nc + 5, 3
        self.det = nn.ModuleList([nn.Conv2d(c, self.no * self.na, 1) for c in (4 * w, 8 * w, 16 * w)])
        anchors = torch.tensor([[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]])
        self.register_buffer("anchors", anchors.float().view(3, 3, 2))
        self.strides = (8, 16, 32)

    def forward(self, x):
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
        x = self.focus(x)
        x3 = self.b2(self.b1(x))
        x4 = self.b3(x3)
        x5 = self.b4(x4)
        l4 = self.lat4(x5)
        n4 = self.n4(torch.cat([F.interpolate(l4, scale_factor=2, mode="nearest"), x4], 1))
        l3 = self.lat3(n4)
        o3 = self.n3(torch.cat([F.interpolate(l3, scale_factor=2, mode="nearest"), x3], 1))
        o4 = self.p4(torch.cat([self.down3(o3), l3], 1))
        o5 = self.p5(torch.cat([self.down4(o4), l4], 1))
        out = []
        for i, f in enumerate((o3, o4, o5)):
            y = self.det[i](f)
            bs, _, ny, nx = y.shape
            y = y.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous().sigmoid()
            yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
            grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()
            anchor_grid = self.anchors[i].view(1, self.na, 1, 1, 2)
            xy = (y[..., 0:2] * 2 - 0.5 + grid) * self.strides[i]
            wh = (y[..., 2:4] * 2) ** 2 * anchor_grid
            out.append(torch.cat((xy, wh, y[..., 4:]), -1).view(bs, -1, self.no))
        return torch.cat(out, 1)


class AlexNetLrn(nn.Module):
    """The original AlexNet (one tower), with its local response normalizations, at
    half width: what Caffe-era classifiers converted to ONNX look like."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 48, 11, 4, 2),
            nn.ReLU(),
            nn.LocalResponseNorm(5, 1e-4, 0.75, 2.0),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(48, 128, 5, padding=2, groups=2),
            nn.ReLU(),
            nn.LocalResponseNorm(5, 1e-4, 0.75, 2.0),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(128, 192, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(192, 192, 3, padding=1, groups=2),
            nn.ReLU(),
            nn.Conv2d(192, 128, 3, padding=1, groups=2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(128 * 6 * 6, 1024), nn.ReLU(), nn.Linear(1024, 1000))

    def forward(self, x):
        return self.classifier(self.features(x))


# --- the fixtures ----------------------------------------------------------------------


def bert(opset):
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )
    return BertEncoder(randomize_norm_stats(transformers.BertModel(cfg).eval()))


class BertEncoder(nn.Module):
    """BertModel called the way sentence-encoder export scripts call it: the three int64
    inputs by name, the two outputs as a tuple."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


def image(n, h, w):
    return {"dtype": "float32", "shape": [n, 3, h, w], "low": -1.0, "high": 1.0}


FIXTURES = {
    "mobilenet_v3_small": dict(
        build=lambda: randomize_norm_stats(torchvision.models.mobilenet_v3_small().eval()),
        build_text="torchvision.models.mobilenet_v3_small()",
        args=lambda: (torch.randn(1, 3, 224, 224),),
        names=(["input"], ["logits"]),
        dynamo=True,
        dynamic={"x": {0: "batch"}},
        inputs={"input": image(1, 224, 224)},
        pins={"input": [1, 3, 224, 224]},
    ),
    "mobilenet_v3_large": dict(
        build=lambda: randomize_norm_stats(torchvision.models.mobilenet_v3_large().eval()),
        build_text="torchvision.models.mobilenet_v3_large()",
        args=lambda: (torch.randn(1, 3, 224, 224),),
        names=(["input"], ["logits"]),
        dynamo=False,
        opset=13,
        dynamic={"input": {0: "batch"}},
        inputs={"input": image(2, 224, 224)},
        pins={"input": [2, 3, 224, 224]},
    ),
    "dbnet_fpn": dict(
        build=lambda: randomize_norm_stats(DbnetFpn().eval()),
        build_text="DbnetFpn() (scripts/export_models.py)",
        args=lambda: (torch.randn(1, 3, 640, 640),),
        names=(["x"], ["maps"]),
        dynamo=False,
        opset=17,
        dynamic={"x": {2: "height", 3: "width"}},
        inputs={"x": image(1, 640, 640)},
        pins={"x": [1, 3, 640, 640]},
    ),
    "vit_small": dict(
        build=lambda: randomize_norm_stats(
            torchvision.models.VisionTransformer(
                image_size=224, patch_size=16, num_layers=4, num_heads=6, hidden_dim=384, mlp_dim=1536
            ).eval()
        ),
        build_text="torchvision.models.VisionTransformer(image_size=224, patch_size=16, num_layers=4, "
        "num_heads=6, hidden_dim=384, mlp_dim=1536)",
        args=lambda: (torch.randn(1, 3, 224, 224),),
        names=(["pixels"], ["logits"]),
        dynamo=True,
        dynamic=None,
        inputs={"pixels": image(1, 224, 224)},
        pins={},
    ),
    "yolo_style": dict(
        build=lambda: randomize_norm_stats(YoloStyle().eval()),
        build_text="YoloStyle() (scripts/export_models.py)",
        args=lambda: (torch.rand(1, 3, 416, 416),),
        names=(["images"], ["detections"]),
        dynamo=False,
        opset=12,
        dynamic=None,
        inputs={"images": {"dtype": "float32", "shape": [1, 3, 416, 416], "low": 0.0, "high": 1.0}},
        pins={},
    ),
    "alexnet_lrn": dict(
        build=lambda: randomize_norm_stats(AlexNetLrn().eval()),
        build_text="AlexNetLrn() (scripts/export_models.py)",
        args=lambda: (torch.randn(1, 3, 224, 224),),
        names=(["data"], ["prob"]),
        dynamo=False,
        opset=11,
        dynamic=None,
        inputs={"data": image(1, 224, 224)},
        pins={},
    ),
}

BERT_INPUTS = {
    "input_ids": {"dtype": "int64", "shape": [1, 128], "low": 0, "high": 30522},
    "attention_mask": {"dtype": "int64", "shape": [1, 128], "mask_tail": 16},
    "token_type_ids": {"dtype": "int64", "shape": [1, 128], "low": 0, "high": 2},
}
for opset, dynamo in ((14, False), (18, True)):
    FIXTURES[f"bert_opset{opset}"] = dict(
        build=lambda opset=opset: bert(opset),
        build_text="BertEncoder(transformers.BertModel(BertConfig(hidden_size=384, num_hidden_layers=6, "
        "num_attention_heads=12, intermediate_size=1536)))",
        args=lambda: (
            torch.randint(0, 30522, (1, 128)),
            torch.ones(1, 128, dtype=torch.int64),
            torch.zeros(1, 128, dtype=torch.int64),
        ),
        names=(["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state", "pooler_output"]),
        dynamo=dynamo,
        opset=opset,
        dynamic=(
            {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "token_type_ids")}
        ),
        inputs=BERT_INPUTS,
        pins={n: [1, 128] for n in BERT_INPUTS},
    )


def export(kind, spec):
    model = spec["build"]()
    args = spec["args"]()
    in_names, out_names = spec["names"]
    kwargs = dict(input_names=in_names, output_names=out_names)
    call = f"torch.onnx.export({spec['build_text']}, args, input_names={in_names}, output_names={out_names}"
    if spec["dynamo"]:
        kwargs["dynamo"] = True
        if "opset" in spec:
            kwargs["opset_version"] = spec["opset"]
            call += f", opset_version={spec['opset']}"
        if spec["dynamic"]:
            params = list(model.forward.__code__.co_varnames[1 : 1 + len(in_names)])
            dyn = spec["dynamic"]
            shapes = {}
            for p, n in zip(params, in_names):
                d = dyn.get(p, dyn.get(n))
                shapes[p] = {k: torch.export.Dim.DYNAMIC for k in d} if d else None
            kwargs["dynamic_shapes"] = shapes
            call += f", dynamic_shapes={ {p: list(v) if v else None for p, v in shapes.items()} }"
        call += ", dynamo=True)"
    else:
        kwargs["dynamo"] = False
        kwargs["opset_version"] = spec["opset"]
        call += f", opset_version={spec['opset']}"
        if spec["dynamic"]:
            kwargs["dynamic_axes"] = spec["dynamic"]
            call += f", dynamic_axes={spec['dynamic']}"
        call += ", dynamo=False)"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        with torch.no_grad():
            torch.onnx.export(model, args, path, **kwargs)
        m = onnx.load(path, load_external_data=True)
    stripped = strip(m)
    onnx.save(stripped, os.path.join(OUT, f"{kind}.onnx"))
    return {
        "file": f"{kind}.onnx",
        "exporter": f"torch {torch.__version__} " + ("(torch.export-based, dynamo=True)" if spec["dynamo"] else "(TorchScript-based, dynamo=False)"),
        "libraries": {"torchvision": torchvision.__version__, "onnx": onnx.__version__}
        | ({"transformers": __import__("transformers").__version__} if kind.startswith("bert") else {}),
        "export_call": call,
        "opset": max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "inputs": spec["inputs"],
        "pins": spec["pins"],
    }


def strip(m):
    """The graph with each large float initializer replaced by an empty stub recording its
    value statistics and a seed."""
    seed = 0
    for t in m.graph.initializer:
        if t.data_type != onnx.TensorProto.FLOAT:
            continue
        a = onnx.numpy_helper.to_array(t)
        if a.size <= STRIP_ABOVE:
            continue
        seed += 1
        stats = {"mean": float(a.mean()), "std": float(a.std()), "low": float(a.min()), "high": float(a.max())}
        stub = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims))
        stub.doc_string = json.dumps({"refill": "normal, clipped to [low, high]", **stats, "seed": seed})
        t.CopyFrom(stub)
    # The torch.export-based exporter annotates every node with its Python stack trace and
    # module path; they are provenance, not semantics, and would make up most of the file.
    for n in m.graph.node:
        del n.metadata_props[:]
        n.doc_string = ""
    return m


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest_path = os.path.join(OUT, "manifest.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    kinds = sys.argv[1:] or list(FIXTURES)
    for kind in kinds:
        print(f"exporting {kind}", flush=True)
        manifest[kind] = export(kind, FIXTURES[kind])
    with open(manifest_path, "w") as f:
        json.dump(dict(sorted(manifest.items())), f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()

"""A ResNet exported by torch.onnx (not by our generator) compiles and matches ORT.

torchvision does not install beside the CPU torch build here, so the torchvision architecture is
written out in plain torch; skipped where torch is absent.
"""

import numpy as np
import pytest

from tests.helpers import check_against_ort

torch = pytest.importorskip("torch")
nn = torch.nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int, down: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (
            nn.Sequential(
                nn.Conv2d(cin, width * 4, 1, stride, bias=False), nn.BatchNorm2d(width * 4)
            )
            if down
            else None
        )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, blocks=(3, 4, 6, 3)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for width, n, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2)):
            seq = [Bottleneck(cin, width, stride, True)]
            seq += [Bottleneck(width * 4, width, 1, False) for _ in range(n - 1)]
            layers.append(nn.Sequential(*seq))
            cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, 1000)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(self.layers(x)), 1))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_torch_exported_resnet_matches_ort(tmp_path, layout):
    torch.manual_seed(0)
    net = ResNet(blocks=(1, 1, 1, 1)).eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.2, 0.6)
    path = str(tmp_path / "resnet_torch.onnx")
    x = torch.randn(1, 3, 96, 96)
    try:
        torch.onnx.export(
            net,
            (x,),
            path,
            opset_version=17,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        )
    except Exception as e:  # noqa: BLE001  (an exporter missing its own dependencies)
        pytest.skip(f"torch.onnx.export unavailable: {e}")
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 96, 96)).astype(np.float32)}
    check_against_ort(path, feeds, layout=layout)

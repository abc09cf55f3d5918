"""ResNet image-classification training: the reference throughput workload (MLPerf-style ResNet-50).

Owns the model (torchvision ResNet, random init), its SGD optimizer and three input pipelines:
`synthetic` (ImageNet-like uint8 images decoded and normalised in DataLoader workers, so
`dataloader_workers` matters), `synthetic_device` (one batch resident on the device: the compute
ceiling, no input pipeline) and `imagefolder` (real JPEGs with the usual training transforms).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch.utils.data import Dataset

from raybench.sections import HardwareSpec
from raybench.workloads import Reference, Servable, WorkloadParams, _memory, register
from raybench.workloads._graphs import GraphedForward

# torchvision is imported where a model or a dataset is built, not here: the sweep's driver
# imports this module to validate the parameters, and torchvision (with torch._dynamo, which
# it loads) took 1.4 s of the driver's start on a small machine (docs/journal/2026-11.md).

# ImageNet channel statistics, as torchvision's reference training script uses.
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class ImageParams(WorkloadParams):
    """An image classifier's data and optimizer, shared by the classifier families."""

    image_size: int = Field(224, ge=32, description="square input side in pixels")
    num_classes: int = Field(1000, ge=2)
    data: Literal["synthetic", "synthetic_device", "imagefolder"] = "synthetic"
    data_path: str | None = Field(None, description="ImageFolder root when data is imagefolder")
    synthetic_samples: int = Field(50_000, ge=1, description="length of one synthetic epoch")
    lr: float = Field(0.1, gt=0)
    activation_checkpointing: bool = Field(
        False, description="recompute each residual block's activations in backward instead "
        "of keeping them: less memory per sample, about one more forward of time")

    @model_validator(mode="after")
    def _data_path(self) -> ImageParams:
        if self.data == "imagefolder":
            if not self.data_path:
                raise ValueError("data: imagefolder needs data_path (an ImageFolder root)")
            if not Path(self.data_path).is_dir():
                raise ValueError(f"data_path '{self.data_path}' is not a directory")
        return self


class ResnetParams(ImageParams):
    depth: Literal[18, 34, 50, 101, 152] = 50


def synthetic_image(seed: int, i: int, size: int) -> torch.Tensor:
    """Sample i's random uint8 image, the same wherever and in whatever order it is made."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + i)
    return torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g)


def normalise(img: torch.Tensor, mean: torch.Tensor = _MEAN, std: torch.Tensor = _STD
              ) -> torch.Tensor:
    """uint8 images to normalised floats; `mean` and `std` already on img's device copy
    nothing from the host (which a CUDA graph's capture could not hold)."""
    mean, std = mean.to(img.device), std.to(img.device)
    return (img.float().div_(255) - mean) / std


def resident_batch(p: ImageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """`data: synthetic_device`'s one batch (normal images, random labels), on the host: the
    trial and its bare twin each put it on their device."""
    g = torch.Generator().manual_seed(p.seed)
    images = torch.randn(p.batch_size, 3, p.image_size, p.image_size, generator=g)
    return images, torch.randint(0, p.num_classes, (p.batch_size,), generator=g)


class SyntheticImages(Dataset):
    """Deterministic random uint8 images, normalised like decoded JPEGs would be."""

    def __init__(self, n: int, size: int, classes: int, seed: int):
        self.n, self.size, self.classes, self.seed = n, size, classes, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return normalise(synthetic_image(self.seed, i, self.size)), i % self.classes


# NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md,
# "Training performance results" / "Inference performance results" (pytorch-21.03 NGC
# container, DALI input pipeline, ResNet-50 v1.5 at 224 px; training per GPU from the 1-GPU
# rows, at the launch script's per-platform batch).
_RN50 = "NVIDIA DeepLearningExamples ResNet50 v1.5 PyTorch README (NGC 21.03)"

RESNET50 = {"workload.name": "resnet", "workload.depth": 50, "workload.image_size": 224}
RESNET50_REFERENCES = (
    Reference("A100", RESNET50, "train", "tf32", None, 938.0, _RN50 + ", DGX A100 80GB"),
    Reference("A100", RESNET50, "train", "amp_fp16", None, 2470.0, _RN50 + ", DGX A100 80GB"),
    Reference("V100-SXM2-16GB", RESNET50, "train", "fp32", None, 367.0, _RN50 + ", DGX-1 16GB"),
    Reference("V100-SXM2-16GB", RESNET50, "train", "amp_fp16", None, 1200.0,
              _RN50 + ", DGX-1 16GB"),
    Reference("V100-SXM2-32GB", RESNET50, "train", "fp32", None, 356.0, _RN50 + ", DGX-1 32GB"),
    Reference("V100-SXM2-32GB", RESNET50, "train", "amp_fp16", None, 1156.0,
              _RN50 + ", DGX-1 32GB"),
    Reference("V100-SXM2-16GB", RESNET50, "inference", "fp32", 256, 1261.0, _RN50),
    Reference("V100-SXM2-16GB", RESNET50, "inference", "amp_fp16", 256, 3382.0, _RN50),
    Reference("T4", RESNET50, "inference", "fp32", 64, 428.0, _RN50),
    Reference("T4", RESNET50, "inference", "amp_fp16", 256, 1198.0, _RN50),
)


@register
class Resnet(Servable):
    name = "resnet"
    Params = ResnetParams
    references = RESNET50_REFERENCES
    params: ResnetParams
    serving_graphs = True

    @classmethod
    def unsupported(cls, params: WorkloadParams, hardware: HardwareSpec
                    ) -> tuple[str, str] | None:
        return None  # the step accumulates micro-batches (ctx.micro_batches)

    def setup(self) -> None:
        p, ctx = self.params, self.ctx
        torch.manual_seed(p.seed)
        self._model = self.build()
        if p.activation_checkpointing:
            _memory.wrap_blocks(self._model, self.blocks())
        self.net = ctx.prepare_model(self._model, self.clock)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=p.lr, momentum=0.9, weight_decay=1e-4)
        self.scaler = ctx.grad_scaler()
        self.loss_fn = torch.nn.CrossEntropyLoss()
        if p.data == "synthetic_device":
            images, labels = resident_batch(p)
            self._resident = (ctx.prepare_images(images), labels.to(ctx.device))
        else:
            self.loader = ctx.make_loader(self._dataset(), p.batch_size)

    def build(self) -> torch.nn.Module:
        """The network, randomly initialised (after the seed is set); an image classifier
        family that trains and serves the same way subclasses this workload and builds its own
        (and names its own `blocks`)."""
        import torchvision  # torchvision (1.4 s): see the note at the top

        return getattr(torchvision.models, f"resnet{self.params.depth}")(
            num_classes=self.params.num_classes)

    def blocks(self) -> tuple[type[torch.nn.Module], ...]:
        """What activation checkpointing wraps."""
        from torchvision.models import resnet  # torchvision (1.4 s): see the note at the top

        return resnet.BasicBlock, resnet.Bottleneck

    def _dataset(self) -> Dataset:
        p = self.params
        if p.data == "imagefolder":
            import torchvision  # torchvision (1.4 s): see the note at the top

            t = torchvision.transforms
            tf = t.Compose([
                t.RandomResizedCrop(p.image_size), t.RandomHorizontalFlip(), t.ToTensor(),
                t.Normalize(_MEAN.flatten().tolist(), _STD.flatten().tolist()),
            ])
            return torchvision.datasets.ImageFolder(p.data_path, transform=tf)
        return SyntheticImages(p.synthetic_samples, p.image_size, p.num_classes, p.seed)

    def batches(self) -> Iterator[Any]:
        """A step's micro-batches (one unless hardware.grad_accum_steps says more)."""
        k = self.ctx.hardware.grad_accum_steps
        if self.params.data == "synthetic_device":
            while True:
                yield [self._resident] * k
        micro = self._loader_batches()
        while True:
            yield [next(micro) for _ in range(k)]

    def _loader_batches(self) -> Iterator[Any]:
        epoch = 0
        while True:
            if hasattr(self.loader.sampler, "set_epoch"):
                self.loader.sampler.set_epoch(epoch)
            yield from self.loader
            epoch += 1

    def to_device(self, batch: Any) -> Any:
        if self.params.data == "synthetic_device":
            return batch
        return [(self.ctx.prepare_images(images), labels.to(self.ctx.device, non_blocking=True))
                for images, labels in batch]

    def step(self, batch: Any) -> torch.Tensor:
        """One optimizer step over its micro-batches, each loss scaled so the gradient is the
        mean over all of them; returns that mean loss."""
        self.opt.zero_grad(set_to_none=True)
        total = None  # one micro-batch (the usual case) adds no device work for the sum
        for images, labels in self.ctx.micro_batches(self.net, batch):
            with self.ctx.autocast():
                loss = self.loss_fn(self.net(images), labels) / len(batch)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        return total

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @classmethod
    def serving_inputs(cls, params: WorkloadParams, ids: np.ndarray) -> dict[str, np.ndarray]:
        # Decoded uint8 images, as an image service receives them; normalised on the replica.
        imgs = [synthetic_image(params.seed, int(i), params.image_size) for i in ids]
        return {"image": torch.stack(imgs).numpy()}

    def setup_serving(self) -> None:
        p = self.params
        torch.manual_seed(p.seed)
        self._model = self.build()
        self._model.eval()
        if self.ctx.inference_dtype is not None:
            self._model.to(self.ctx.inference_dtype)
        self.net = self.ctx.prepare_model(self._model)
        self._stats = _MEAN.to(self.ctx.device), _STD.to(self.ctx.device)
        self._graphed: GraphedForward | None = None

    def capture_serving(self, largest: int) -> None:
        p = self.params
        sample = torch.zeros(3, p.image_size, p.image_size, dtype=torch.uint8,
                             device=self.ctx.device)
        self._graphed = GraphedForward(self._forward, sample, largest)

    def _forward(self, images: torch.Tensor) -> torch.Tensor:
        """Device uint8 images to top-1 classes: what a serving call runs on the GPU."""
        x = normalise(images, *self._stats)
        if self.ctx.inference_dtype is not None:
            x = x.to(self.ctx.inference_dtype)
        x = self.ctx.prepare_images(x)
        with torch.no_grad():
            return self.net(x).argmax(dim=1)

    def serve(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        x = torch.from_numpy(inputs["image"]).to(self.ctx.device, non_blocking=True)
        top1 = (self._graphed or self._forward)(x)
        return {"pred": top1.cpu().numpy()}  # the copy back waits for the device

    def describe(self) -> dict[str, Any]:
        return {"input_shape": [3, self.params.image_size, self.params.image_size]}

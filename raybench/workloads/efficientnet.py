"""EfficientNet B0-B7 image-classification training and serving (torchvision's models).

Owns the variant and its input resolution; everything else is the ResNet workload's: the same
input pipelines (synthetic ImageNet-like images decoded in DataLoader workers, a resident
device batch, or an ImageFolder), SGD, the same timed step and the same serving path. Each
variant's native resolution is the crop size torchvision publishes with its ImageNet weights
(read from torchvision, nothing downloaded): 224 px for B0 up to 600 px for B7, so the FLOPs
per image grow about a hundredfold across the family.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from raybench.workloads import register
from raybench.workloads.resnet import ImageParams, Resnet

Variant = Literal["b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"]


def native_resolution(variant: str) -> int:
    """The crop size of torchvision's ImageNet weights for this variant (224 for b0)."""
    import torchvision  # here and below, not at the top: as in resnet.py

    weights = getattr(torchvision.models, f"EfficientNet_{variant.upper()}_Weights")
    return int(weights.IMAGENET1K_V1.transforms().crop_size[0])


class EfficientnetParams(ImageParams):
    variant: Variant = "b0"
    image_size: int | None = Field(  # type: ignore[assignment]
        None, ge=32, description="square input side in pixels; unset: the variant's native "
        "resolution (b0 224 ... b7 600)")
    dropout: float | None = Field(None, ge=0, lt=1, description="classifier dropout; unset: "
                                  "torchvision's per-variant value (0.2 for b0 ... 0.5 for b7)")

    @model_validator(mode="after")
    def _resolution(self) -> EfficientnetParams:
        if self.image_size is None:  # resolved here, so rows and trial keys show the real size
            object.__setattr__(self, "image_size", native_resolution(self.variant))
        return self


@register
class Efficientnet(Resnet):
    name = "efficientnet"
    Params = EfficientnetParams
    params: EfficientnetParams

    def build(self) -> torch.nn.Module:
        import torchvision  # torchvision (1.4 s): see resnet.py's note

        p = self.params
        extra = {"dropout": p.dropout} if p.dropout is not None else {}
        return getattr(torchvision.models, f"efficientnet_{p.variant}")(
            num_classes=p.num_classes, **extra)

    def blocks(self) -> tuple[type[torch.nn.Module], ...]:
        from torchvision.models import efficientnet  # torchvision (1.4 s): see resnet.py's note

        return efficientnet.MBConv, efficientnet.FusedMBConv

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "variant": self.params.variant}

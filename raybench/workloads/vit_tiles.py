"""A Prithvi-style ViT tile model: which tile and batch fit a GPU, and how many pixels per second.

Owns the model (a ViT encoder over multispectral tiles, patch 16, sizes tiny / base / large /
huge after ViT-Ti/B/L/H, with a light transposed-convolution decoder back to per-pixel output;
random weights), its two modes (`inference`: forward under no_grad, model and input cast to the
precision's dtype, optionally replayed as a CUDA graph; `train`: forward under autocast,
backward, AdamW step) with forward / backward / optimizer times recorded through `clock.phase`,
and the pixel count the metrics turn into pixels/s. Inputs are one random batch resident on the
device: the question here is compute and memory, not the input pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from raybench.columns import Metric
from raybench.records import RankRecord
from raybench.sections import HardwareSpec
from raybench.workloads import Servable, WorkloadParams, register
from raybench.workloads._graphs import capture
from raybench.workloads._memory import Checkpointed

# (embed dim, depth, heads): ViT-Ti/B/L/H. Prithvi-EO 1.0 is a ViT-B (~100M), Prithvi-EO 2.0
# comes as ViT-L (~300M) and ViT-H (~600M).
SIZES = {"tiny": (192, 12, 3), "base": (768, 12, 12), "large": (1024, 24, 16),
         "huge": (1280, 32, 16)}


class VitTilesParams(WorkloadParams):
    batch_size: int = Field(1, ge=1, description="tiles per rank per step")
    size: Literal["tiny", "base", "large", "huge"] = "base"
    tile: int = Field(256, ge=32, description="square tile side in pixels, a multiple of patch")
    bands: int = Field(6, ge=1, description="spectral bands (HLS has 6)")
    patch: int = Field(16, ge=2)
    num_classes: int = Field(2, ge=2, description="per-pixel classes")
    decoder_channels: int = Field(256, ge=8)
    mode: Literal["inference", "train"] = "inference"
    lr: float = Field(1e-4, gt=0)
    activation_checkpointing: bool = Field(
        False, description="training: recompute each encoder layer's activations in backward "
        "instead of keeping them (memory for about one more forward of time)")
    cuda_graphs: bool = Field(
        False, description="inference on a GPU: replay the forward as one captured CUDA graph, "
        "as deployed inference does; without it a small ViT-L forward is bound by the host's "
        "kernel launches, not the GPU")

    @model_validator(mode="after")
    def _tile(self) -> VitTilesParams:
        if self.tile % self.patch:
            raise ValueError(f"tile {self.tile} is not a multiple of patch {self.patch}")
        steps = (self.patch & (self.patch - 1)) == 0
        if not steps:
            raise ValueError(f"patch {self.patch} must be a power of two for the decoder")
        if self.activation_checkpointing and self.mode != "train":
            raise ValueError("activation_checkpointing saves training memory: set mode: train, "
                             "or activation_checkpointing: false")
        if self.cuda_graphs and self.mode != "inference":
            raise ValueError("cuda_graphs captures the inference forward only: set mode: "
                             "inference, or cuda_graphs: false for training")
        return self


class TileViT(nn.Module):
    def __init__(self, p: VitTilesParams):
        super().__init__()
        dim, depth, heads = SIZES[p.size]
        self.grid = p.tile // p.patch
        self.embed = nn.Conv2d(p.bands, dim, kernel_size=p.patch, stride=p.patch)
        self.pos = nn.Parameter(torch.zeros(1, self.grid * self.grid, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.checkpointed = p.activation_checkpointing
        if self.checkpointed:  # each layer recomputed in backward (training only)
            self.encoder.layers = nn.ModuleList(Checkpointed(m) for m in self.encoder.layers)
        self.norm = nn.LayerNorm(dim)
        self.decoder = build_decoder(dim, p.decoder_channels, p.num_classes, p.patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        if self.checkpointed:  # the encoder's own loop inspects its layers' attention modules
            for layer in self.encoder.layers:
                tokens = layer(tokens)
        else:
            tokens = self.encoder(tokens)
        tokens = self.norm(tokens)
        b, n, d = tokens.shape
        feat = tokens.transpose(1, 2).reshape(b, d, self.grid, self.grid)
        return self.decoder(feat)


def build_decoder(dim: int, channels: int, classes: int, patch: int) -> nn.Sequential:
    """x2 transposed convolutions from the patch grid back to pixels, then a 1x1 head."""
    layers: list[nn.Module] = [nn.Conv2d(dim, channels, 1)]
    c = channels
    for _ in range(patch.bit_length() - 1):
        nxt = max(c // 2, 16)
        layers += [nn.ConvTranspose2d(c, nxt, 2, stride=2), nn.BatchNorm2d(nxt), nn.GELU()]
        c = nxt
    layers.append(nn.Conv2d(c, classes, 1))
    return nn.Sequential(*layers)


@register
class VitTiles(Servable):
    name = "vit_tiles"
    Params = VitTilesParams
    params: VitTilesParams

    def setup(self) -> None:
        p, ctx = self.params, self.ctx
        torch.manual_seed(p.seed)
        self._model = TileViT(p)
        training = p.mode == "train"
        self._model.train(training)
        dtype = None if training else ctx.inference_dtype  # training: autocast, fp32 weights
        if dtype is not None:
            self._model.to(dtype)
        self.net = ctx.prepare_model(self._model, self.clock)
        g = torch.Generator().manual_seed(p.seed)
        x = torch.randn(p.batch_size, p.bands, p.tile, p.tile, generator=g)
        if dtype is not None:
            x = x.to(dtype)
        y = torch.randint(0, p.num_classes, (p.batch_size, p.tile, p.tile), generator=g)
        self._batch = (ctx.prepare_images(x), y.to(ctx.device))
        self._graph: torch.cuda.CUDAGraph | None = None
        if p.cuda_graphs:
            self._capture()
        if training:
            self.opt = torch.optim.AdamW(self.net.parameters(), lr=p.lr)
            self.scaler = ctx.grad_scaler()
            self.loss_fn = nn.CrossEntropyLoss()

    @classmethod
    def unsupported(cls, params: WorkloadParams, hardware: HardwareSpec
                    ) -> tuple[str, str] | None:
        if hardware.grad_accum_steps > 1 and params.mode != "train":
            return "hardware.grad_accum_steps", "inference has no gradients to accumulate"
        return None

    @classmethod
    def measure_defaults(cls, params: WorkloadParams) -> dict[str, Any]:
        # What tile benchmarks conventionally use: training steps cost ~3x and settle sooner.
        if params.mode == "train":
            return {"warmup_steps": 5, "measure_steps": 20}
        return {"warmup_steps": 10, "measure_steps": 50}

    def batches(self) -> Iterator[Any]:
        while True:
            yield self._batch

    def to_device(self, batch: Any) -> Any:
        return batch

    def step(self, batch: Any) -> torch.Tensor | None:
        images, labels = batch
        ctx = self.ctx
        if self.params.mode == "inference":
            with self.clock.phase("forward"):
                self.infer(images)
            return None
        self.opt.zero_grad(set_to_none=True)
        k = ctx.hardware.grad_accum_steps  # micro-batches: the resident batch k times
        total = None  # one micro-batch (the usual case) adds no device work for the sum
        for x, y in ctx.micro_batches(self.net, [(images, labels)] * k):
            with self.clock.phase("forward"), ctx.autocast():
                loss = self.loss_fn(self.net(x), y) / k
            with self.clock.phase("backward"):
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        with self.clock.phase("optimizer"):
            if self.scaler:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
        return total

    @classmethod
    def forward_only(cls, params: WorkloadParams) -> bool:
        return params.mode == "inference"

    def forward_probe(self) -> Callable[[], Any]:
        images = self._batch[0]
        return lambda: self.infer(images)

    def infer(self, images: torch.Tensor) -> torch.Tensor:
        """One inference forward, exactly as timed (bench forward-check times this call too)."""
        if self._graph is not None:  # the captured forward reads the one resident batch
            self._graph.replay()
            return self._out
        with torch.no_grad():
            return self.net(images)

    def _capture(self) -> None:
        if not self.ctx.is_cuda:
            raise ValueError("workload.cuda_graphs needs a GPU trial (hardware.num_gpus >= 1)")
        # the captured forward reads the resident batch itself: no copy into a graph's input
        self._graph, self._out = capture(self.net, self._batch[0])

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @classmethod
    def serving_inputs(cls, params: WorkloadParams, ids: np.ndarray) -> dict[str, np.ndarray]:
        tiles = []
        for i in ids:
            g = torch.Generator().manual_seed(params.seed * 1_000_003 + int(i))
            tiles.append(torch.randn(params.bands, params.tile, params.tile, generator=g))
        return {"tile": torch.stack(tiles).numpy()}

    def setup_serving(self) -> None:
        # Queries come in any batch size (the last offline batch, one server query), so the
        # forward runs eager: a CUDA graph is captured for one input shape.
        p = self.params
        torch.manual_seed(p.seed)
        self._model = TileViT(p).eval()
        if self.ctx.inference_dtype is not None:
            self._model.to(self.ctx.inference_dtype)
        self.net = self.ctx.prepare_model(self._model)

    def serve(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        x = torch.from_numpy(inputs["tile"]).to(self.ctx.device, non_blocking=True)
        if self.ctx.inference_dtype is not None:
            x = x.to(self.ctx.inference_dtype)
        with torch.no_grad():
            classes = self.net(self.ctx.prepare_images(x)).argmax(dim=1).to(torch.uint8)
        return {"pred": classes.cpu().numpy()}

    @property
    def trains(self) -> bool:
        return self.params.mode == "train"

    def describe(self) -> dict[str, Any]:
        p = self.params
        return {"input_shape": [p.bands, p.tile, p.tile], "pixels_per_sample": p.tile * p.tile}

    headline_metric = "train/pixels_per_s"
    size_axis = "workload.tile"
    columns = (
        Metric("train/pixels_per_s", "pixels/s", "samples/s x pixels per tile"),
        Metric("train/pixels_per_s_per_mb", "pixels/s/MB", "pixels/s per MB of the memory "
               "peak that limits the tile (device on GPU, process on CPU)"),
    )

    @classmethod
    def row_metrics(cls, records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
        """Tiles of different sizes are not the same sample: pixels/s compares them, and per MB
        of the memory that limits the tile (device peak on GPU, process peak on CPU)."""
        pixels = records[0].describe["pixels_per_sample"]
        px_s = row["train/samples_per_s"] * pixels
        peak = row["mem/peak_allocated_mb"] or row["host/rss_peak_mb"]
        return {"train/pixels_per_s": px_s,
                "train/pixels_per_s_per_mb": px_s / peak if peak else None}

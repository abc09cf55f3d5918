"""Synthetic xView3 scenes with the real layout: `python -m raybench.data.synth_xview3`.

Owns a scene model (a tilted swath with nodata outside it, a wavy north-south coastline and an
island, wind and bathymetry fields, SAR sea clutter with speckle in dB, vessels as bright compact
targets sized by their length, fixed infrastructure near shore) and writing it: seven float32
GeoTIFFs in UTM, shoreline contours, 16-column label CSVs. Everything is a function of (seed,
scene, block), drawn through `draws.Draws` so that no NumPy release changes it, and the 10 m
bands are written in row blocks, so memory stays bounded at any size.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import rasterio
from rasterio.transform import Affine
from rasterio.warp import transform as warp_transform

from raybench.data import xview3 as x3
from raybench.data.draws import Draws

log = logging.getLogger(__name__)
BLOCK_ROWS = 512  # rows per windowed write: one strip of GeoTIFF tiles
REAL_DENSITY = 0.35  # labels per megapixel: about 220 labels in ~650 Mpx real scenes


@dataclass(frozen=True)
class Scene:
    scene_id: str
    split: str
    index: int
    seed: int
    rows: int
    cols: int
    epsg: int
    x0: float
    y0: float
    coast_col: float  # mean column of the coastline; land lies east of it
    coast_amp: float
    coast_period: float
    coast_phase: float
    island: tuple[float, float, float]  # centre row, centre col, radius (px)
    swath: tuple[float, float, float, float]  # left/right edge at row 0 and their slope
    density: float = REAL_DENSITY  # labels per megapixel

    @property
    def transform(self) -> Affine:
        return Affine(x3.SCALE_10M, 0, self.x0, 0, -x3.SCALE_10M, self.y0)

    @property
    def coarse_transform(self) -> Affine:
        s = x3.SCALE_10M * x3.COARSE_FACTOR
        return Affine(s, 0, self.x0, 0, -s, self.y0)

    def coast(self, r: np.ndarray) -> np.ndarray:
        return self.coast_col + self.coast_amp * np.sin(2 * np.pi * r / self.coast_period
                                                        + self.coast_phase)

    def land(self, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        ir, ic, rad = self.island
        return (c > self.coast(r)) | ((r - ir) ** 2 + (c - ic) ** 2 < rad**2)

    def valid(self, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        left0, right0, slope_l, slope_r = self.swath
        return (c >= left0 + slope_l * r) & (c <= right0 + slope_r * r)

    def wind(self, r: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        speed = 7 + 4 * np.sin(r / (0.7 * self.rows) * np.pi + self.seed) * np.cos(c / self.cols)
        direction = (200 + 60 * np.sin(c / (0.5 * self.cols) + r / self.rows)) % 360
        return speed, direction

    def bathymetry(self, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        metres_from_coast = (self.coast(r) - c) * x3.SCALE_10M
        return np.where(self.land(r, c), 2 + 0.01 * np.abs(metres_from_coast),
                        -np.clip(8 + 0.03 * metres_from_coast, 5, 5000))

    def contours(self) -> list[np.ndarray]:
        """Shoreline as (row, col) polylines in scene pixels, a point every 5 px."""
        r = np.arange(0, self.rows, 5, dtype=np.float64)
        c = self.coast(r)
        inside = (c >= 0) & (c < self.cols)
        out = [np.stack([r[inside], c[inside]], axis=1)] if inside.any() else []
        ir, ic, rad = self.island
        theta = np.linspace(0, 2 * np.pi, max(16, int(2 * np.pi * rad / 5)), endpoint=False)
        ring = np.stack([ir + rad * np.sin(theta), ic + rad * np.cos(theta)], axis=1)
        keep = (ring[:, 0] >= 0) & (ring[:, 0] < self.rows) & (ring[:, 1] >= 0) & \
               (ring[:, 1] < self.cols)
        if keep.sum() > 2:
            out.append(ring[keep])
        return out


def make_scenes(n: int, rows: int, cols: int, seed: int,
                density: float = REAL_DENSITY) -> list[Scene]:
    """`n` scenes, about three quarters train, at least one of each split when n >= 2."""
    rng = Draws(seed)
    n_val = 0 if n < 2 else max(1, n // 4)
    scenes = []
    for i in range(n):
        split = "validation" if i >= n - n_val else "train"
        sid = rng.bytes(8).hex() + x3.SPLITS[split]
        zone = rng.integers(1, 61)
        north = rng.random() < 0.8
        scenes.append(Scene(
            scene_id=sid, split=split, index=i, seed=seed, rows=rows, cols=cols, density=density,
            epsg=(32600 if north else 32700) + zone,
            x0=float(rng.uniform(200_000, 600_000)),
            y0=float(rng.uniform(4_000_000, 7_000_000) if north else rng.uniform(2e6, 9e6)),
            coast_col=float(cols * rng.uniform(0.65, 0.85)), coast_amp=float(cols * 0.05),
            coast_period=float(rows * rng.uniform(0.5, 1.5)),
            coast_phase=float(rng.uniform(0, 2 * np.pi)),
            island=(float(rows * rng.uniform(0.2, 0.8)), float(cols * rng.uniform(0.3, 0.5)),
                    float(min(rows, cols) * rng.uniform(0.03, 0.06))),
            swath=(float(cols * rng.uniform(0.0, 0.08)), float(cols * rng.uniform(0.92, 1.05)),
                   float(rng.uniform(0, 0.06)), float(rng.uniform(-0.06, 0))),
        ))
    return scenes


def make_targets(scene: Scene) -> pd.DataFrame:
    """Vessels on open water and infrastructure near shore, with their true extents."""
    rng = Draws([scene.seed, scene.index, 7])
    # Small test scenes still get a handful; a higher density gives a detector more to learn
    # from in a short CPU run (the layout is the same, only the count changes).
    n = max(8, int(scene.density * scene.rows * scene.cols / 1e6))
    contours = scene.contours()
    rows, cols, kinds = [], [], []
    tries = 0
    while len(rows) < n and tries < 200 * n:
        tries += 1
        r = rng.uniform(20, scene.rows - 20)
        c = rng.uniform(20, scene.cols - 20)
        ra, ca = np.array([r]), np.array([c])
        if scene.land(ra, ca)[0] or not scene.valid(ra, ca)[0]:
            continue
        d = x3.distance_to_shore_px(ra, ca, contours)[0]
        infra = rng.random() < 0.2
        if infra and not 30 < d < 300:
            continue  # platforms and buoys stand within 3 km of the coast
        if not infra and d < 25:
            continue
        rows.append(r)
        cols.append(c)
        kinds.append("infra" if infra else "vessel")
    k = len(rows)
    fishing = rng.random(k) < 0.45
    length = np.where(fishing, rng.uniform(12, 60, k), rng.uniform(20, 300, k))
    length = np.where(np.array(kinds) == "infra", rng.uniform(10, 40, k), length)
    return pd.DataFrame({
        "row": np.round(rows).astype(int), "col": np.round(cols).astype(int), "kind": kinds,
        "length_m": length, "heading": rng.uniform(0, np.pi, k), "fishing": fishing,
        "peak_db": 12 + 10 * np.log10(length / 10) + rng.uniform(0, 6, k),
    })


def render_block(scene: Scene, band: str, r0: int, r1: int, targets: pd.DataFrame) -> np.ndarray:
    """One row block of a 10 m band in dB (nodata outside the swath), deterministic per block."""
    rng = Draws([scene.seed, scene.index, 1 if band == "vh" else 2, r0])
    r = np.arange(r0, r1, dtype=np.float64)[:, None]
    c = np.arange(scene.cols, dtype=np.float64)[None, :]
    speed, _ = scene.wind(r, c)
    base = (-26.3 if band == "vh" else -16.4) + 0.6 * (speed - 7) - 3.0 * (c / scene.cols - 0.5)
    land = scene.land(r, c)
    texture = 3.0 * np.sin(r / 37.0 + c / 91.0) * np.cos(c / 23.0 - r / 53.0) \
        + rng.normal(0.0, 1.5, (r1 - r0, scene.cols))
    level_db = np.where(land, base + 9.0 + texture, base)
    speckle = rng.erlang(4, 1 / 4.0, level_db.shape)  # 4-look intensity speckle
    linear = 10 ** (level_db / 10) * speckle
    for t in targets.itertuples():
        _add_target(linear, t, r0, r1, scene.cols, band)
    db = np.maximum(10 * np.log10(linear), -50.0)
    return np.where(scene.valid(r, c), db, x3.NODATA).astype(np.float32)


def _add_target(linear: np.ndarray, t, r0: int, r1: int, cols: int, band: str) -> None:
    half_len = max(1.0, t.length_m / x3.SCALE_10M / 2)
    reach = int(half_len + 4)
    if t.row + reach < r0 or t.row - reach >= r1:
        return
    ra = np.arange(max(r0, t.row - reach), min(r1, t.row + reach + 1))
    ca = np.arange(max(0, t.col - reach), min(cols, t.col + reach + 1))
    dr, dc = ra[:, None] - t.row, ca[None, :] - t.col
    along = dr * np.sin(t.heading) + dc * np.cos(t.heading)
    across = -dr * np.cos(t.heading) + dc * np.sin(t.heading)
    width = max(0.8, half_len / 4)
    peak = 10 ** ((t.peak_db + (-26.3 if band == "vh" else -16.4)) / 10)
    blob = peak * np.exp(-0.5 * ((along / half_len) ** 2 + (across / width) ** 2))
    linear[ra[0] - r0: ra[-1] - r0 + 1, ca[0]: ca[-1] + 1] += blob


def coarse_bands(scene: Scene) -> dict[str, np.ndarray]:
    """The five 500 m rasters, sampled at the centres of their 500 m cells."""
    cr, cc = x3.coarse_shape(scene.rows, scene.cols)
    f = x3.COARSE_FACTOR
    r = (np.arange(cr, dtype=np.float64)[:, None] + 0.5) * f
    c = (np.arange(cc, dtype=np.float64)[None, :] + 0.5) * f
    land = scene.land(r, c)
    valid = scene.valid(r, c)
    speed, direction = scene.wind(r, c)
    quality = np.clip((np.abs(speed - 7) / 2).astype(int), 0, 3)
    on_water = valid & ~land
    nd = x3.NODATA
    return {
        "bathymetry": scene.bathymetry(r, c),
        "owimask": np.where(valid, land.astype(np.float64), nd),
        "wind_speed": np.where(on_water, speed, nd),
        "wind_direction": np.where(on_water, direction, nd),
        "wind_quality": np.where(on_water, quality, nd),
    }


def write_scene(scene: Scene, root: Path) -> pd.DataFrame:
    """Write one scene's rasters and shoreline; return its label rows."""
    folder = root / scene.split / scene.scene_id
    folder.mkdir(parents=True, exist_ok=True)
    targets = make_targets(scene)
    profile = dict(driver="GTiff", dtype="float32", count=1, nodata=x3.NODATA,
                   crs=f"EPSG:{scene.epsg}", tiled=True, blockxsize=512, blockysize=512)
    for band in x3.FINE_CHANNELS:
        with rasterio.open(folder / x3.CHANNEL_FILES[band], "w", height=scene.rows,
                           width=scene.cols, transform=scene.transform, **profile) as dst:
            for r0 in range(0, scene.rows, BLOCK_ROWS):
                r1 = min(scene.rows, r0 + BLOCK_ROWS)
                window = rasterio.windows.Window(0, r0, scene.cols, r1 - r0)
                dst.write(render_block(scene, band, r0, r1, targets), 1, window=window)
    cr, cc = x3.coarse_shape(scene.rows, scene.cols)
    coarse_profile = {**profile, "blockxsize": 256, "blockysize": 256}
    for band, data in coarse_bands(scene).items():
        with rasterio.open(folder / x3.CHANNEL_FILES[band], "w", height=cr, width=cc,
                           transform=scene.coarse_transform, **coarse_profile) as dst:
            dst.write(data.astype(np.float32), 1)
    shore = root / "shoreline" / scene.split
    shore.mkdir(parents=True, exist_ok=True)
    # Labels measure distance from exactly what the file holds (float32 points).
    contours = [c.astype(np.float32).astype(np.float64) for c in scene.contours()]
    x3.save_shoreline(x3.shoreline_path(shore, scene.scene_id), contours)
    return labels_for(scene, targets, contours)


def labels_for(scene: Scene, targets: pd.DataFrame, contours: list[np.ndarray]) -> pd.DataFrame:
    rng = Draws([scene.seed, scene.index, 11])
    k = len(targets)
    # Pixel centres through the affine transform, then UTM -> WGS84.
    xs, ys = rasterio.transform.xy(scene.transform, targets["row"].to_numpy(),
                                   targets["col"].to_numpy(), offset="center")
    lon, lat = warp_transform(f"EPSG:{scene.epsg}", "EPSG:4326", list(xs), list(ys))
    vessel = (targets["kind"] == "vessel").to_numpy()
    length_known = rng.random(k) > 0.25
    # the box bounds the rendered hull (length along the heading, a quarter of it across), so
    # its diagonal is about the length, as the reference's length rule assumes
    half_len = np.maximum(1.0, targets["length_m"].to_numpy() / x3.SCALE_10M / 2)
    half_w = np.maximum(0.8, half_len / 4)
    sin, cos = np.abs(np.sin(targets["heading"])), np.abs(np.cos(targets["heading"]))
    half_r = half_len * sin + half_w * cos
    half_c = half_len * cos + half_w * sin
    box = length_known & vessel
    dist = x3.distance_to_shore_px(targets["row"].to_numpy(), targets["col"].to_numpy(), contours)
    is_vessel = pd.array(np.where(rng.random(k) < 0.1, None, vessel), dtype="boolean")
    fishing_known = vessel & (rng.random(k) > 0.3)
    is_fishing = pd.array(np.where(fishing_known, targets["fishing"], None), dtype="boolean")
    return pd.DataFrame({
        "detect_lat": lat, "detect_lon": lon,
        "vessel_length_m": np.where(length_known, targets["length_m"].round(1), np.nan),
        "source": rng.choice(["ais", "manual", "ais/manual"], size=k, p=[0.5, 0.2, 0.3]),
        "detect_scene_row": targets["row"], "detect_scene_column": targets["col"],
        "is_vessel": is_vessel, "is_fishing": is_fishing,
        "distance_from_shore_km": dist * x3.SCALE_10M / 1000,
        "scene_id": scene.scene_id,
        "confidence": rng.choice(["HIGH", "MEDIUM", "LOW"], size=k, p=[0.45, 0.35, 0.2]),
        "top": np.where(box, targets["row"] - half_r, np.nan),
        "left": np.where(box, targets["col"] - half_c, np.nan),
        "bottom": np.where(box, targets["row"] + half_r, np.nan),
        "right": np.where(box, targets["col"] + half_c, np.nan),
        "detect_id": [f"{scene.scene_id[:8]}{rng.bytes(6).hex()}" for _ in range(k)],
    })[x3.LABEL_COLUMNS]


def generate(out: Path, n: int, rows: int, cols: int, seed: int,
             density: float = REAL_DENSITY) -> dict[str, pd.DataFrame]:
    """Write `n` scenes under `out` and the label CSVs; returns labels per split."""
    out = Path(out)
    labels: dict[str, list[pd.DataFrame]] = {s: [] for s in x3.SPLITS}
    for scene in make_scenes(n, rows, cols, seed, density):
        log.info("scene %d/%d %s (%s, %dx%d)", scene.index + 1, n, scene.scene_id, scene.split,
                 rows, cols)
        labels[scene.split].append(write_scene(scene, out))
    (out / "labels").mkdir(parents=True, exist_ok=True)
    frames = {}
    for split, parts in labels.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
            columns=x3.LABEL_COLUMNS)
        frame.to_csv(out / "labels" / f"{split}.csv", index=False)
        frames[split] = frame
    return frames


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raybench.data.synth_xview3",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output root")
    p.add_argument("--scenes", type=int, default=4)
    p.add_argument("--size", default="2400x2400", help="ROWSxCOLS of the 10 m grid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--density", type=float, default=REAL_DENSITY,
                   help="labels per megapixel (real scenes: about 0.35)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        rows, cols = (int(v) for v in args.size.lower().split("x"))
        if rows < 100 or cols < 100 or args.scenes < 1 or not 0 < args.density <= 1000:
            raise ValueError
    except ValueError:
        print(f"raybench: --size {args.size!r} / --scenes {args.scenes}: need ROWSxCOLS of at "
              "least 100x100, at least one scene and a density in (0, 1000]. Fix: e.g. "
              "--size 2400x2400 --scenes 4",
              file=sys.stderr)
        return 2
    frames = generate(Path(args.out), args.scenes, rows, cols, args.seed, args.density)
    print({split: len(f) for split, f in frames.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# One archive for one device call: `.gpu/s/site.tar.xz` (60.0 MB on 2026-11-26) from the two
# parts `../shared/gpu/ray-bundle` builds (`.gpu/a` 48 MiB + `.gpu/b` 28 MiB: over a call's
# 64 MiB with the tracked tree). Left out, none of which raybench loads: Ray's dashboard web
# assets (the folders stay: the dashboard refuses to start without them), py-spy's binary,
# virtualenv and distlib (runtime_env virtualenvs), plotly's JupyterLab extension, cryptography
# (imported only for TLS and cloud credentials). Checked 2026-11-26 with Python 3.12 on this
# machine (`ray start`, `ray job submit`, a rasterio GeoTIFF round trip) and on the lent H200
# (every step of run.sh). Run from the project root after ../shared/gpu/ray-bundle.
set -euo pipefail
work=$(mktemp -d /tmp/slim-XXXX); trap 'rm -rf "$work"' EXIT
for f in .gpu/a/*.tar.xz .gpu/b/*.tar.xz; do tar xJf "$f" -C "$work"; done
cd "$work"
rm -rf ./*.data/ virtualenv virtualenv-*.dist-info distlib cryptography cryptography-*.dist-info
find ray/dashboard/client/build -type f ! -name index.html -delete
cd - > /dev/null
mkdir -p .gpu/s
tar cf - -C "$work" . | xz -9e -T0 > .gpu/s/site.tar.xz
ls -l .gpu/s/site.tar.xz

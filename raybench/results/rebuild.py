"""`python -m raybench.rebuild RUN_DIR`: a run's results table again, from its trial files.

Every trial's row is written twice: into `trials/<index>_<key>.json` (first) and into
`results.parquet`. When the table is damaged (a truncated copy, a disk that filled), this
writes it and `results.csv` again from the trial files, in the order the trials ended, and
keeps the damaged table beside them as `results.parquet.damaged-<UTC time>`. Rows that have
no trial file (a preprocess stage's, a search's answer) are not in them: a `--resume` then
runs those stages again (a cached stage in seconds). Exit 0 when rebuilt, 2 when there is
nothing to rebuild from.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from raybench import console
from raybench.results.table import to_frame, write_table


def rebuild(run: Path) -> tuple[int, Path | None]:
    """Rebuild `run`'s table; returns the rows written and where the damaged table went."""
    rows = []
    for path in sorted((run / "trials").glob("*.json")):
        try:
            rows.append(json.loads(path.read_text())["row"])
        except (ValueError, KeyError, TypeError):  # a trial file cut short: its trial reruns
            print(f"raybench: skipping {path}, which holds no whole row", file=sys.stderr)
    if not rows:
        raise FileNotFoundError(f"{run / 'trials'} holds no trial file with a row")
    rows.sort(key=lambda r: (str(r.get("end_time")), r.get("trial_index") or 0))
    parquet = run / "results.parquet"
    kept = None
    if parquet.exists():
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        kept = run / f"results.parquet.damaged-{stamp}"
        parquet.rename(kept)
    write_table(run, to_frame(rows))
    return len(rows), kept


def main(argv: list[str] | None = None, prog: str = "python -m raybench.rebuild") -> int:
    p = console.parser(prog, "Write a run's results table again from its trial files.")
    p.add_argument("run", help="the run directory (it holds trials/ and results.parquet)")
    args = p.parse_args(argv)
    run = Path(args.run)
    try:
        n, kept = rebuild(run)
    except FileNotFoundError as e:
        print(f"raybench: {e}. Fix: pass a run directory written by python -m raybench.sweep",
              file=sys.stderr)
        return 2
    print(f"{run / 'results.parquet'}: {n} trial rows from {run / 'trials'}"
          + (f"; the damaged table is {kept}" if kept else ""))
    return 0

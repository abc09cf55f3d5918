"""The record of a run: rows, the results table, the run directory and the long-lived history.

`rows.py` makes and completes a row (fixed cost, interval, system columns, measured-peak MFU);
`writer.py` writes each as its trial ends (table, trial file, history, sinks) and resumes;
`table.py` owns the files and their layout; `rundir.py` the run's directory, lock and run files;
`history.py` every run's rows under a results root; `fingerprint.py` the `system/*` columns;
`peaks.py` this system's measured matmul peak; `rebuild.py` a damaged table again from its trial
files; `tracking.py` the MLflow sink. Nothing here imports the report.
"""

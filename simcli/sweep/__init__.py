"""Sweeps: many simcli commands from one spec, on a process pool or Ray, resumably stored.

- ``spec``: the YAML spec (pydantic), its validation against the commands' configs,
  expansion into points (grid x zip, explicit points, filters) with stable point ids;
- ``target``: the library call a point runs (:mod:`simcli.scenario.registry`: a command's
  config and the function returning its ``--format json`` object), not a command line;
- ``executors``: a local process pool and Ray tasks, over chunks of points;
- ``store``: SQLite (default) or Parquet, one row per point, resume by point id;
- ``runner``: skip what is stored, run the rest, store each batch, progress, Ctrl-C;
- ``report``: the flat points table (export, points.csv) and the HTML report.
"""

from simcli.sweep.errors import SweepError

__all__ = ["SweepError"]

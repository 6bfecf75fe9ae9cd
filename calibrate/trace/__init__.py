"""Profiler traces of real steps against simcli's prediction of the same step.

A ``torch.profiler`` trace of a training step or a serving step (prefill, decode) says what
the GPU really ran; simcli's decomposition priced by the cost model says what it should
have run and for how long. This package reads the trace (:mod:`.kineto`), names every
kernel's op class (:mod:`.classify`), finds the steps and why the GPU sat idle in them
(:mod:`.timeline`), and sets measured against predicted class by class (:mod:`.compare`).
``simcli trace import`` is the command over it. Needs no torch: traces are read as JSON.
"""

from calibrate.trace.classify import CLASS_LABELS, OP_CLASSES, classify, classify_name
from calibrate.trace.compare import (
    Prediction,
    ServingWorkload,
    TraceComparison,
    TrainWorkload,
    compare,
    op_class,
    predict_serving,
    predict_train,
)
from calibrate.trace.kineto import Trace, TraceError, load_trace
from calibrate.trace.timeline import GAP_KINDS, PHASES, Timeline, build_timeline

__all__ = [
    "CLASS_LABELS",
    "GAP_KINDS",
    "OP_CLASSES",
    "PHASES",
    "Prediction",
    "ServingWorkload",
    "Timeline",
    "Trace",
    "TraceComparison",
    "TraceError",
    "TrainWorkload",
    "build_timeline",
    "classify",
    "classify_name",
    "compare",
    "load_trace",
    "op_class",
    "predict_serving",
    "predict_train",
]

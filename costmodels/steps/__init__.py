"""Step models: what a step of real software costs beyond its kernels. Training micro-batch
costs (:mod:`.training`), serving engine iterations (:mod:`.serving`), training and
serving memory (:mod:`.memory`), all priced through the one decomposition of
:mod:`workloads.decompose` with the op models of :mod:`costmodels.ops`."""

"""``fit``: Adam on the ELBO with one compiled step, tf.data minibatches, progress, checkpoints.

Reproducibility and exact resumption come from making every random quantity a pure function of
``(seed, step)``: the minibatch of step ``t`` is a slice of epoch ``t // batches_per_epoch``'s
permutation, drawn statelessly from ``(seed, epoch)``, and the Monte Carlo noise of step ``t`` is
drawn statelessly from ``(seed, t)``. A checkpoint therefore needs only the model, the optimiser
state and the step count; a resumed run replays exactly the batches and noise an uninterrupted
run would have used.

Layout (each piece can be replaced without touching the others):

* :mod:`.history` — :class:`History`, what ``fit`` returns and saves next to checkpoints;
* :mod:`.batches` — the seeded minibatch and noise streams and the ``tf.data`` pipelines;
* :mod:`.checkpoint` — saving and resuming (model, optimiser, step count, history);
* :mod:`.optimizers` — :func:`adam`, the optimiser (one fused update kernel per variable);
* :mod:`.step` — the compiled training step (optionally XLA) and its Cholesky-failure flag;
* :mod:`.reuse` — the step a model keeps, reused by later ``fit`` calls (no new trace per call);
* :mod:`.tempering` — KL tempering schedules (``fit(..., kl_schedule=...)``);
* :mod:`.sampling` — :func:`collect_samples`, the sample set of a sampling family (SGHMC);
* :mod:`.loop` — argument checks and the loop that ties them together (:func:`fit`).
"""

from .batches import batch_indices
from .history import History
from .loop import fit
from .optimizers import adam
from .sampling import collect_samples
from .tempering import ConstantSchedule, KLSchedule, LinearSchedule, PaperSchedule

__all__ = [
    "fit",
    "collect_samples",
    "adam",
    "History",
    "batch_indices",
    "KLSchedule",
    "PaperSchedule",
    "LinearSchedule",
    "ConstantSchedule",
]

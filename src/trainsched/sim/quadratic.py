"""Time to a target loss: a simulated run's updates replayed on a noisy quadratic.

:func:`trainsched.sim.sync.simulate_sync` says *when* each update of the shared model happens,
with how many samples and how stale; this module says what those updates do to a loss whose
value is known exactly, so that protocols and policies can be ranked by time to a target loss
rather than by samples per second.

**The model.** Loss ``L(w) = ½ Σ_i h_i w_i²`` over ``dims`` coordinates with curvatures ``h_i``
log-spaced from 1 down to ``1/condition``, starting at ``w_i = start``. An update of B samples
made from weights read τ updates ago (its staleness) uses the gradient at those weights plus
sampling noise whose variance shrinks with the batch:

    g = h ⊙ w_{v−τ} + noise · √(h / B) ⊙ z,      z ~ N(0, I)
    w_{v+1} = w_v − lr · lr_scale · g

with ``lr_scale`` the protocol's (``effective_batch / (N·b)``: the learning-rate rule of a sync
policy). So staleness enters only through the weights the gradient was computed at: a large
stale step on a high-curvature coordinate overshoots, which is what makes early asynchrony
costly (large gradients, far from the optimum) and late asynchrony cheap (small gradients,
noise-dominated). Local SGD on a quadratic is exactly BSP (gradients are linear in the weights,
so averaging replicas commutes with the steps); replica drift is out of this model's reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainsched.errors import TrainschedError
from trainsched.sim.sync import SyncSimResult
from trainsched.units import is_int

__all__ = ["LossCurve", "NoisyQuadratic", "replay_loss"]


@dataclass(frozen=True, kw_only=True)
class NoisyQuadratic:
    """The quadratic of the module docstring; ``lr`` is the learning rate at BSP's batch."""

    dims: int = 16
    condition: float = 100.0
    noise: float = 1.0
    lr: float = 1.0
    start: float = 1.0

    def __post_init__(self) -> None:
        if not (is_int(self.dims) and self.dims >= 1):
            raise TrainschedError(f"noisy quadratic: dims must be >= 1, got {self.dims!r}")
        for name in ("condition", "noise", "lr", "start"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    not (math.isfinite(value) and value >= 0):
                raise TrainschedError(f"noisy quadratic: {name} must be a finite number >= 0, "
                                      f"got {value!r}")
        if self.condition < 1:
            raise TrainschedError(f"noisy quadratic: condition must be >= 1, got "
                                  f"{self.condition!r}")

    @property
    def curvatures(self) -> np.ndarray:
        return np.logspace(0.0, -math.log10(self.condition), self.dims)

    def loss(self, w: np.ndarray) -> float:
        return float(0.5 * np.dot(self.curvatures, w * w))


@dataclass(frozen=True, kw_only=True)
class LossCurve:
    """The loss after every update (``loss``) at its time (``time_s``), and the start loss."""

    initial_loss: float
    time_s: tuple[float, ...]
    loss: tuple[float, ...]

    def time_to(self, target: float) -> float | None:
        """The first time the loss is at most ``target`` (``None``: never in this run)."""
        if self.initial_loss <= target:
            return 0.0
        for t, value in zip(self.time_s, self.loss, strict=True):
            if value <= target:
                return t
        return None

    @property
    def final_loss(self) -> float:
        return self.loss[-1] if self.loss else self.initial_loss


def replay_loss(result: SyncSimResult, model: NoisyQuadratic | None = None, *,
                seed: int = 0) -> LossCurve:
    """Apply ``result``'s updates, in the order the server applied them, to ``model``."""
    model = model or NoisyQuadratic()
    h = model.curvatures
    rng = np.random.default_rng(seed)
    depth = max(result.update_staleness, default=0) + 1
    history = [np.full(model.dims, float(model.start))] * depth  # ring of past weights
    w = history[0]
    losses = []
    for v, (samples, tau, scale) in enumerate(zip(result.update_samples,
                                                  result.update_staleness,
                                                  result.update_lr_scale, strict=True)):
        read = history[(v - tau) % depth]
        grad = h * read + model.noise * np.sqrt(h / samples) * rng.standard_normal(model.dims)
        w = w - model.lr * scale * grad
        history[(v + 1) % depth] = w
        losses.append(model.loss(w))
    return LossCurve(initial_loss=model.loss(np.full(model.dims, float(model.start))),
                     time_s=result.update_end_s, loss=tuple(losses))

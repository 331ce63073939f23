"""What ``fit`` records."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import List, Optional

__all__ = ["History"]


@dataclass
class History:
    """What ``fit`` recorded: the ELBO estimate (full-data units) at logged steps, and timings.

    ``step[i]`` counts the steps done; ``elbo[i]`` is the untempered ELBO estimate of that step's
    minibatch and draws, even when the step maximised a tempered objective; ``kl_weight[i]`` is
    the KL weight ``beta`` that step used (1.0 without ``kl_schedule``).
    """

    step: List[int] = field(default_factory=list)
    elbo: List[float] = field(default_factory=list)
    wall_time: List[float] = field(default_factory=list)
    kl_weight: List[float] = field(default_factory=list)
    seed: Optional[int] = None
    num_data: Optional[int] = None
    resumed_from: int = 0

    @property
    def elbo_per_datapoint(self) -> List[float]:
        return [e / self.num_data for e in self.elbo] if self.num_data else list(self.elbo)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "History":
        return cls(**json.loads(text))

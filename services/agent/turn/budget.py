"""What is left of a turn's budget, summarization included."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.domain import Budget, Usage
from services.llm.model import budget_exhausted, budget_left, require_call


@dataclass
class TurnBudget:
    """What is left of a turn's budget."""

    budget: Budget
    used: Usage = field(default_factory=Usage)

    def remaining(self) -> Budget:
        return budget_left(self.budget, self.used)

    def for_summary(self) -> Budget:
        """What summarization may spend: everything but the turn's own model call.

        One call and a share of the output tokens (half, at most 512) stay
        reserved, so that a turn is never summarized into a budget it cannot
        finish with.
        """
        left = self.require_call()
        reserve_output = max(1, min(left.max_output_tokens // 2, 512))
        if left.max_model_calls < 2:
            raise budget_exhausted("max_model_calls", self.budget.max_model_calls)
        if left.max_output_tokens - reserve_output < 1:
            raise budget_exhausted("max_output_tokens", self.budget.max_output_tokens)
        return Budget(
            max_output_tokens=left.max_output_tokens - reserve_output,
            max_model_calls=left.max_model_calls - 1,
            max_input_tokens=left.max_input_tokens,
        )

    def require_call(self, input_tokens: int = 0) -> Budget:
        """The budget left for one more model call, or RESOURCE_EXHAUSTED."""
        return require_call(self.budget, self.used, input_tokens)

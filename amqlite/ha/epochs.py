"""Epochs: the number of the current master's term, persisted by each node.

Every promotion to ACTIVE mints a new epoch greater than any the node has held or
heard. The two roles mint from disjoint sets (the primary odd numbers, the backup
even ones), so two promotions made on opposite sides of a partition, or by a node
that restarted while cut off, can never produce the same epoch: two active nodes
always hold different epochs, and the higher one fences the other.
"""

from __future__ import annotations

from .states import HaRole


def next_epoch(role: HaRole, above: int) -> int:
    """The smallest epoch greater than ``above`` that a node of ``role`` may mint."""
    candidate = above + 1
    if minted_by(candidate) is not role:
        candidate += 1
    return candidate


def minted_by(epoch: int) -> HaRole | None:
    """The role that mints ``epoch`` (None for 0, the epoch of a pair never active)."""
    if epoch <= 0:
        return None
    return HaRole.PRIMARY if epoch % 2 else HaRole.BACKUP

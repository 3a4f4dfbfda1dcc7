"""What a rewrite did: every attention candidate, fused or left alone with the stated reason."""

from __future__ import annotations

import dataclasses
import json

PACK_QKV = "pack_qkv"  # the opt-in pass that packs the Q/K/V projections (pack_qkv.py)


@dataclasses.dataclass
class Candidate:
    """One attention candidate: a Softmax between two MatMuls, or a standard Attention node."""

    rule: str  # the pass that looked at it
    nodes: list[str]  # where it is: the names of its main nodes
    fused: bool = False
    reason: str = ""  # why it was left alone (empty when fused)
    fused_node: str = ""  # the name of the FusedAttention node that replaced it
    details: dict = dataclasses.field(default_factory=dict)  # scale, is_causal, mask kind, ...

    def to_dict(self) -> dict:
        d = {"rule": self.rule, "nodes": list(self.nodes), "fused": self.fused}
        if self.fused:
            d["fused_node"] = self.fused_node
            d["details"] = dict(self.details)
        else:
            d["reason"] = self.reason
        return d


@dataclasses.dataclass
class Report:
    """The result of `fuse_attention`: the candidates, the per-pass counts, and timing."""

    candidates: list[Candidate] = dataclasses.field(default_factory=list)
    counts: dict = dataclasses.field(default_factory=dict)  # {pass name: fused count}
    other_softmax: list[str] = dataclasses.field(default_factory=list)  # softmaxes that are not attention
    seconds: float = 0.0

    @property
    def found(self) -> int:
        return len(self.candidates)

    @property
    def fused(self) -> int:
        return sum(c.fused for c in self.candidates)

    @property
    def left(self) -> list[Candidate]:
        return [c for c in self.candidates if not c.fused]

    def to_dict(self) -> dict:
        return {
            "candidates_found": self.found,
            "fused": self.fused,
            "left_alone": len(self.left),
            "counts": dict(self.counts),
            "candidates": [c.to_dict() for c in self.candidates],
            "other_softmax_untouched": list(self.other_softmax),
            "seconds": round(self.seconds, 3),
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def format(self) -> str:
        """A short human-readable report."""
        lines = [f"attention candidates found: {self.found}, fused: {self.fused}, left alone: {len(self.left)}"]
        for name, count in self.counts.items():
            if name == PACK_QKV:
                absorbed = sum(bool(c.details.get("qkv_bias_absorbed")) for c in self.candidates if c.fused)
                lines.append(f"  {name}: {count} of {self.fused} fused nodes read one packed Q/K/V projection "
                             f"(not bit-exact); {absorbed} with its bias absorbed as the node's qkv_bias input "
                             "(no Add)")
            else:
                lines.append(f"  {name}: {count} fused")
        for c in self.left:
            lines.append(f"  left alone [{', '.join(c.nodes)}]: {c.reason}")
        for c in self.candidates:
            if c.fused and c.details.get("packed_qkv_why_not"):
                lines.append(f"  Q/K/V not packed [{c.fused_node}]: {c.details['packed_qkv_why_not']}")
        if self.other_softmax:
            lines.append(f"  softmaxes that are not attention (untouched): {len(self.other_softmax)}")
        return "\n".join(lines)

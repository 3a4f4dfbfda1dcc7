"""opsfuse's graph passes: find the attention subgraphs of exported transformers and replace
each with one ``com.opsfuse::FusedAttention`` node, exactly (see ``sdpa_subgraph`` and
``onnx_attention`` for what is covered and why candidates are left alone).

    import onnx
    from opsfuse.graph_passes import fuse_attention

    model, report = fuse_attention(onnx.load("model.onnx"))
    print(report.format())

Built on onnx-ir: one module per rule, each with ``pattern`` / ``check`` / ``rewrite``.
"""

from __future__ import annotations

from .pipeline import PASSES, fuse_attention, run_pipeline
from .report import Candidate, Report
from .sdpa_subgraph import Reject

__all__ = ["PASSES", "Candidate", "Reject", "Report", "fuse_attention", "run_pipeline"]

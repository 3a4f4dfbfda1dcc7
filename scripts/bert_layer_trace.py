"""BERT's attention layer traced by the kernel's own clocks, alone and between the model's GEMMs (a
diagnostic for the in-model slowdown of docs/notes/cuda_kernel.md, session 10: the kernel is 17-35 %
slower after the layer's GEMMs than back to back, cuDNN's is not). The trace tells whether the SM
clock drops there (clock64 against globaltimer), or which wait grows: Q, the K / V tiles, the
warpgroups' turn, the products. Needs the trace build, as scripts/hopper_trace.py does:

    python scripts/bert_layer_trace.py OUT.npz [CALLS [CONTEXTS [MASKS]]]

Per mask (none, add0: additive zeros, add_pad: transformers' padded) and context (alone /
projection / layer, as scripts/bert_layer_in_context.py builds them), CALLS traced calls (default
3), each after 10 warm calls of its context, summarized by scripts/hopper_trace.py's summarize(),
then the first round's phases alone (where the layer context's time goes). Two more contexts
probe the first round's waits: layer+touch (the layer, then one element per 64 KB of the packed
Q/K/V read right before the attention: its pages translated, its data mostly not fetched) and
layer+mask (the layer, then the mask read whole right before the attention); one probes the
code: layer+warmall (the layer, then the same call on other inputs of the same shape and mask
pattern right before the traced one: every SM runs the kernel's code paths once, while the traced
call's own data stay as cold as in "layer")."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opsfuse.cuda as oc  # noqa: E402
from bert_attention_sweep import B, mask_of  # noqa: E402
from bert_layer_in_context import HID, S, layer_tensors, views  # noqa: E402
from hopper_trace import EVENTS, ROUNDS, summarize  # noqa: E402


def first_round(tr):
    """Round 0's phases (median over the blocks, first warpgroup): ns, and the SM's clocks."""
    done = tr[:, 0, 0, 0] > 0
    ns = np.median(np.diff(tr[done, 0, 0, :7].astype(np.float64), axis=-1), axis=0)
    clk = np.median(np.diff(tr[done, 0, 0, 8:15].astype(np.float64), axis=-1), axis=0)
    names = ("setup+Q", "K0 wait", "turn", "tile0", "loop", "epilogue")
    print("   round 0 ns: " + "  ".join(f"{n} {x:.0f}" for n, x in zip(names, ns))
          + "  | clocks: " + "  ".join(f"{x:.0f}" for x in clk), flush=True)


def main():
    out = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x, w_qkv, b_qkv, w_o, w_1, w_2 = layer_tensors()
    packed = torch.addmm(b_qkv, x, w_qkv)
    other = torch.randn_like(packed)  # layer+warmall's inputs
    buf = torch.zeros(sms * 2 * ROUNDS * EVENTS, dtype=torch.int64, device="cuda")
    saved = {}

    def run(ctx, m, trace):
        p = packed if ctx == "alone" else torch.addmm(b_qkv, x, w_qkv)
        if ctx == "layer+touch":
            p.view(-1)[::32768].float().sum()
        if ctx == "layer+mask" and m is not None:
            m.float().sum()
        if ctx == "layer+warmall":
            oc.fused_attention(*views(other), attn_mask=None if m is None else m.clone())
        if trace:
            os.environ["OPSFUSE_HOPPER_TRACE_PTR"] = str(buf.data_ptr())
        try:
            y = oc.fused_attention(*views(p), attn_mask=m)
        finally:
            os.environ.pop("OPSFUSE_HOPPER_TRACE_PTR", None)
        if ctx.startswith("layer"):
            h = y.transpose(1, 2).reshape(B * S, HID) @ w_o
            (torch.nn.functional.gelu(h @ w_1) @ w_2).sum()

    contexts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["alone", "projection", "layer"]
    masks = sys.argv[4].split(",") if len(sys.argv) > 4 else ["none", "add0", "add_pad"]
    for mname in masks:
        m = mask_of(mname, S)
        for ctx in contexts:
            for c in range(calls):
                for _ in range(10):
                    run(ctx, m, False)
                buf.zero_()
                run(ctx, m, True)
                torch.cuda.synchronize()
                tr = buf.view(sms, 2, ROUNDS, EVENTS).cpu().numpy()
                name = f"{mname} {ctx} #{c}"
                summarize(name, tr, (S + 127) // 128)
                first_round(tr)
                saved[name] = tr
    np.savez_compressed(out, **saved)


if __name__ == "__main__":
    main()

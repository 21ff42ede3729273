#!/usr/bin/env python3
"""An encoder-decoder at a size where pipelining pays, planned by GraphPipe, PipeDream and Piper.

`nn.Transformer(512, 8, 4 + 4 layers, ffn 2048)` with source and target `nn.Embedding`s (vocab 8000,
sequence 128) and a causal target mask, as T5/BART users write it, exported with torch 2.x's default
exporter (`dynamo=True`, a dynamic batch). The three planners plan it on 8 simulated summit V100s,
mini-batch 128, under a per-device memory limit that rules out data parallelism, and GraphPipe's
stage DAG is printed: the target embedding (and the decoder's first self-attention) runs as a stage
beside the encoder's, which PipeDream's and Piper's chains cannot do.

    python3 tests/zoo/plan_encoder_decoder.py --graphpipe build/graphpipe [--out DIR] [--memory-limit GB]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile

import torch
import torch.nn as nn


class EncoderDecoder(nn.Module):
    def __init__(self, vocab=8000, d=512):
        super().__init__()
        self.src = nn.Embedding(vocab, d)
        self.tgt = nn.Embedding(vocab, d)
        self.tf = nn.Transformer(d, 8, 4, 4, 2048, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        return self.head(self.tf(self.src(src), self.tgt(tgt), tgt_mask=mask, tgt_is_causal=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphpipe", required=True)
    ap.add_argument("--out", default=None, help="folder for the ONNX file and plans (default: a temporary one)")
    ap.add_argument("--memory-limit", default="2.3", help="GB per device (summit reserves 1.93 of them)")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="gp_encdec_")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "encoder_decoder.onnx")
    if not os.path.exists(path):
        torch.manual_seed(0)
        batch = torch.export.Dim("batch")
        src, tgt = torch.randint(0, 8000, (2, 128)), torch.randint(0, 8000, (2, 128))
        torch.onnx.export(EncoderDecoder(), (src, tgt), path, dynamo=True, input_names=["src", "tgt"],
                          dynamic_shapes=({0: batch}, {0: batch}))
    for planner in ("graphpipe", "pipedream", "piper"):
        plan = os.path.join(out, f"{planner}.json")
        r = subprocess.run([a.graphpipe, "plan", "--model", path, "--cluster", "summit", "--devices", "8", "--batch",
                            "128", "--memory-limit", a.memory_limit, "--planner", planner, "--out", plan],
                           capture_output=True, text=True, check=True)
        pred = re.search(r"throughput ([0-9.]+) samples/s", r.stdout).group(1)
        p = json.load(open(plan))
        print(f"{planner}: {len(p['stages'])} stages, predicted {pred} samples/s")
        if planner == "graphpipe":
            for s in p["stages"]:
                print(f"  stage {s['id']}: {s['ops'][0]} .. {s['ops'][-1]} ({len(s['ops'])} ops), after {s['inputs_from']}")


if __name__ == "__main__":
    main()

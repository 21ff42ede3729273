"""graphpipe.export: the file trains as the module does, with every parameter's PyTorch names (and the
true ties) in the graphpipe.export metadata; a GPT-2-style tied model keeps PyTorch's parameter count
in `graphpipe model info` and trains equal to PyTorch's own steps, in one process and pipelined."""
import json

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn

import graphpipe

VOCAB, SEQ, D = 60, 8, 16
N_TRAIN, BATCH, STEPS = 24, 8, 6


class TinyGPT(nn.Module):
    """GPT-2's shape in miniature: token and learned position embeddings, LayerNorms, a residual
    block, and an LM head that shares the token embedding (`lm_head.weight = wte.weight`)."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(SEQ, D)
        self.ln_1 = nn.LayerNorm(D)
        self.mlp = nn.Linear(D, D)
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        h = self.wte(ids) + self.wpe(torch.arange(ids.size(1)))
        h = h + torch.tanh(self.mlp(self.ln_1(h)))
        return self.lm_head(self.ln_f(h.mean(dim=1)))


def make_model() -> TinyGPT:
    torch.manual_seed(40)
    return TinyGPT()


def dataset():
    rng = np.random.default_rng(40)
    ids = rng.integers(0, VOCAB, size=(N_TRAIN, SEQ), dtype=np.int64)
    label = ((ids[:, 0] + 2 * ids[:, -1]) % VOCAB).astype(np.int64)
    return ids, label


def torch_losses(optimizer: str, ids, label):
    """PyTorch's own training, in graphpipe train --data's sample order (rows [kB, (k+1)B) mod N)."""
    model = make_model()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    ids_t, label_t = torch.from_numpy(ids), torch.from_numpy(label)
    losses = []
    for step in range(STEPS):
        idx = torch.tensor([(step * BATCH + j) % N_TRAIN for j in range(BATCH)])
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(ids_t[idx]), label_t[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    path = tmp_path_factory.mktemp("tied") / "tiny_gpt.onnx"
    model = make_model()
    info = graphpipe.export(model, torch.zeros(2, SEQ, dtype=torch.long), path, loss="cross_entropy")
    return model, info


def test_metadata_lists_every_name_of_each_parameter(tied):
    model, info = tied
    meta = {p.key: p.value for p in onnx.load(info.path).metadata_props}
    doc = json.loads(meta["graphpipe.export"])
    assert doc["format"] == "graphpipe.export/1" and doc["torch"] == torch.__version__
    assert doc["parameters"]["wte.weight"] == ["wte.weight", "lm_head.weight"]
    singles = {k: v for k, v in doc["parameters"].items() if k != "wte.weight"}
    assert singles == {n: [n] for n in ["wpe.weight", "ln_1.weight", "ln_1.bias", "mlp.weight", "mlp.bias",
                                        "ln_f.weight", "ln_f.bias"]}
    assert info.ties == [["wte.weight", "lm_head.weight"]] and not info.unmatched
    assert info.input_names == ("ids",) and info.label_names == ("label",) and info.losses == ("cross_entropy",)
    # Every initializer is one of PyTorch's parameters: nothing merged, nothing duplicated.
    assert sorted(t.name for t in onnx.load(info.path).graph.initializer) == sorted(doc["parameters"])


def test_model_info_counts_parameters_as_pytorch(tied):
    model, info = tied
    n = sum(p.numel() for p in model.parameters())
    assert info.num_parameters == n == VOCAB * D + SEQ * D + 4 * D + D * D + D
    assert graphpipe.model_info(info.path)["params"] == n


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_trains_equal_to_pytorch_single_and_pipelined(tied, optimizer, tmp_path):
    _, info = tied
    ids, label = dataset()
    expected = torch_losses(optimizer, ids, label)
    hp = {"optimizer": optimizer, "lr": 0.1 if optimizer == "sgd" else 0.01, "momentum": 0.9}
    data = {"ids": ids, "label": label}
    # A 2-stage pipeline with the embedding on the first stage and the tied LM head on the second.
    plan = graphpipe.plan(info.path, cluster="h200", devices=2, batch=BATCH, optimizer=optimizer,
                          extra_args=["--no-data-parallel"])  # a model this small: one stage would win
    stage_of = {op: s.id for s in plan.stages for op in s.ops}
    emb = [op for op in stage_of if "wte" in op or "Gather" in op]
    head = [op for op in stage_of if "lm_head" in op]
    assert emb and head and stage_of[emb[0]] != stage_of[head[0]], str(plan)
    piped = graphpipe.train(plan, data, steps=STEPS, **hp).losses
    np.testing.assert_allclose(piped, expected, rtol=0, atol=1e-5)
    if optimizer == "sgd":  # the one-process reference too (once: the test budget is small)
        single = graphpipe.train(plan, data, steps=STEPS, single=True, **hp).losses
        np.testing.assert_allclose(single, expected, rtol=0, atol=1e-5)
    assert expected[-1] < expected[0]  # it learned something: the comparison is not of constants


def test_export_leaves_the_module_as_it_was(tmp_path):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 4)
    rng = torch.random.get_rng_state()
    info = graphpipe.export(model, x, tmp_path / "bn.onnx")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.random.get_rng_state())
    assert model.training
    assert info.input_names == ("input",) and info.output_names == ("output",)
    kinds = {n.op_type for n in onnx.load(info.path).graph.node}
    assert {"BatchNormalization", "Dropout"} <= kinds  # exported in training mode


def test_loss_that_the_importer_would_not_append_is_refused(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(ValueError, match="appends cross_entropy"):
        graphpipe.export(model, torch.randn(2, 4), tmp_path / "m.onnx", loss="mse")
    with pytest.raises(ValueError, match="label/target"):
        graphpipe.export(model, torch.randn(2, 4), tmp_path / "m.onnx", input_names=["label"])


class OwnLossLM(nn.Module):
    """nanoGPT's way: forward(idx, targets) returns the next-token loss, ignore_index=-1."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx, targets):
        logits = self.head(torch.tanh(self.wte(idx)))
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def test_a_module_returning_its_own_loss_trains_on_it(tmp_path):
    torch.manual_seed(2)
    model = OwnLossLM()
    rng = np.random.default_rng(4)
    ids = rng.integers(0, VOCAB, size=(N_TRAIN, SEQ), dtype=np.int64)
    targets = np.where(rng.random((N_TRAIN, SEQ)) < 0.2, -1, rng.integers(0, VOCAB, size=(N_TRAIN, SEQ)))
    info = graphpipe.export(model, (torch.from_numpy(ids[:2]), torch.from_numpy(targets[:2])), tmp_path / "lm.onnx")
    assert info.losses == ("own",) and info.label_names == ("",)
    assert info.input_names == ("idx", "targets")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    expected = []
    for step in range(STEPS):
        rows = [(step * BATCH + j) % N_TRAIN for j in range(BATCH)]
        opt.zero_grad()
        loss = model(torch.from_numpy(ids[rows]), torch.from_numpy(targets[rows]))
        loss.backward()
        opt.step()
        expected.append(loss.item())
    plan = graphpipe.plan(info.path, cluster="h200", devices=2, batch=BATCH, micro_batch=2, optimizer="sgd",
                          extra_args=["--no-data-parallel"])
    got = graphpipe.train(plan, {"idx": ids, "targets": targets}, steps=STEPS, optimizer="sgd", lr=0.1,
                          momentum=0.9).losses
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)

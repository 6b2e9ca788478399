"""One ablation of SetFit's lead on an SST-2 few-shot draw, scored on SST-2 dev: an objective
(ce, scl, cospair: SetFit's cosine-similarity loss over every in-batch pair, setfitpairs:
SetFit's sampled pairs) for a number of steps at a batch size and learning rate, then the
trained head (ce, scl) and logistic regressions (C 1) on the frozen final features, raw and
normalised. Appends a row per head to the TSV. From the repository's root, on a prepared draw:

    PYTHONPATH=src python fewshot/gap/ablate.py --n 100 --draw 1 --loss cospair --steps 250
"""
import argparse, json, random, sys, time
from pathlib import Path
import numpy as np, torch, torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from aclpipe.data.prepared import load_split
from aclpipe.modeling.backbone import load_encoder
from aclpipe.modeling.model import ExitSpec, MultiExitModel
from aclpipe.modeling.batching import collate
from aclpipe.training.loop import build_optimizer, linear_schedule, set_seed
from aclpipe.training.objectives import scl_loss

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=100); p.add_argument("--draw", type=int, default=1)
p.add_argument("--loss", default="ce")  # ce | scl | cospair | setfitpairs
p.add_argument("--steps", type=int, default=250); p.add_argument("--batch", type=int, default=16)
p.add_argument("--lr", type=float, default=2e-5); p.add_argument("--head_lr", type=float, default=1e-3)
p.add_argument("--pooling", default="mean"); p.add_argument("--tag", default="")
p.add_argument("--tsv", default="fewshot/gap/ablations.tsv")
a = p.parse_args()
torch.set_num_threads(1)
t0 = time.time()
data = Path(f"fewshot/data/sst2/s{a.draw}/n{a.n}")
train, dev = load_split(data, "train"), load_split(data, "validation") if (data/"validation.jsonl").exists() else load_split(data, "dev")
set_seed(a.draw)
enc = load_encoder("sentence-transformers/all-MiniLM-L6-v2", False)
spec = ExitSpec(num_labels=2, exits=[6], pooling=a.pooling, dropout=0.1, cls_from_mean=True)
model = MultiExitModel(enc, spec)
set_seed(a.draw)
class T: pass
t = T(); t.lr=a.lr; t.head_lr=a.head_lr; t.weight_decay=0.01
trains = ("encoder", "final_exit") if a.loss in ("ce", "scl") else ("encoder",)
opt = build_optimizer(model, trains, t); sched = linear_schedule(opt, a.steps, 0.1)
labels_all = [r["label"] for r in train]
rng = random.Random(a.draw)

def setfit_pairs():
    # SetFit's legacy pair generation: per iteration, per sentence, one positive and one negative pair
    idx = list(range(len(train))); pairs = []
    by = {c: [i for i in idx if labels_all[i] == c] for c in set(labels_all)}
    for _ in range(20):
        for i in idx:
            c = labels_all[i]
            pairs.append((i, rng.choice(by[c]), 1.0))
            pairs.append((i, rng.choice([j for j in idx if labels_all[j] != c]), 0.0))
    rng.shuffle(pairs); return pairs

if a.loss == "setfitpairs":
    pairs = setfit_pairs(); a.steps = len(pairs) // a.batch
    sched = linear_schedule(opt, a.steps, 0.1)
order = []
model.train()
for step in range(a.steps):
    if a.loss == "setfitpairs":
        chunk = pairs[step*a.batch:(step+1)*a.batch]
        rows = [train[i] for i,_,_ in chunk] + [train[j] for _,j,_ in chunk]
        b = collate(rows, 0, False); b.pop("labels")
        f = model(**b).features[-1]
        u = F.normalize(f, dim=-1); B = len(chunk)
        cos = (u[:B]*u[B:]).sum(-1)
        loss = F.mse_loss(cos, torch.tensor([s for *_, s in chunk]))
    else:
        if len(order) < a.batch:
            perm = list(range(len(train))); rng.shuffle(perm); order += perm
        ids, order = order[:a.batch], order[a.batch:]
        b = collate([train[i] for i in ids], 0, False); y = b.pop("labels")
        out = model(**b)
        if a.loss == "ce":
            loss = F.cross_entropy(out.logits[-1], y)
        elif a.loss == "scl":
            loss = 0.7*F.cross_entropy(out.logits[-1], y) + 0.3*scl_loss(out.features[-1], y, 0.3)
        elif a.loss == "cospair":  # SetFit's CosineSimilarityLoss over every in-batch pair
            u = F.normalize(out.features[-1], dim=-1)
            cos = u @ u.T; tgt = (y[:, None] == y[None, :]).float()
            iu = torch.triu_indices(len(y), len(y), 1)
            loss = F.mse_loss(cos[iu[0], iu[1]], tgt[iu[0], iu[1]])
    loss.backward()
    torch.nn.utils.clip_grad_norm_([q for q in model.parameters() if q.requires_grad], 1.0)
    opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
model.eval()
def embed(rows):
    feats, logits = [], []
    with torch.no_grad():
        for i in range(0, len(rows), 64):
            b = collate(rows[i:i+64], 0, False); b.pop("labels"); o = model(**b)
            feats.append(o.features[-1]); logits.append(o.logits[-1])
    return torch.cat(feats).numpy(), torch.cat(logits).numpy()
ftr, _ = embed(train); fdev, ldev = embed(dev)
ytr = np.array(labels_all); ydev = np.array([r["label"] for r in dev])
res = {}
if a.loss in ("ce", "scl"):
    res["head"] = float((ldev.argmax(1) == ydev).mean())
nrm = lambda x: x/np.linalg.norm(x, axis=1, keepdims=True)
res["lr_norm"] = float((LogisticRegression(C=1.0, max_iter=1000).fit(nrm(ftr), ytr).predict(nrm(fdev)) == ydev).mean())
res["lr_raw"] = float((LogisticRegression(C=1.0, max_iter=1000).fit(ftr, ytr).predict(fdev) == ydev).mean())
secs = time.time() - t0
cfg = f"{a.loss} steps={a.steps} b={a.batch} lr={a.lr} pool={a.pooling}{a.tag}"
with open(a.tsv, "a") as fh:
    for head, acc in res.items():
        fh.write(f"{cfg}\t{a.n}\t{a.draw}\t{head}\t{acc*100:.2f}\t{secs:.0f}\n")
print(cfg, a.n, a.draw, res, f"{secs:.0f}s", flush=True)

"""An unmodified PyTorch Lightning training script, run with fabpool as
PyTorch's allocator (fabpool_torch.install(stats=True)): a small transformer
trained a few steps, GPU memory logged by Lightning's DeviceStatsMonitor
(torch.cuda.memory_stats) and by the module itself
(torch.cuda.max_memory_allocated).  Checks that training ran to its end, that
the logged memory figures are there and positive, and that they agree with
fabpool's own count.  Needs PyTorch, Lightning (lightning or
pytorch_lightning) and a GPU.

    python3 perf/train/lightning_check.py --lib build/adapters/torch/libfabpool_torch.so [--out-dir DIR]

Prints PASS/FAIL lines, then ALL PASS or SOME FAILED (exit 0 only if all pass)."""
import argparse
import csv
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FABPOOL_TORCH_LIBRARY"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out-dir", default=os.path.join(os.environ.get("OUT", "/tmp"), "lightning"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    if args.lib:   # a library of a build tree; without it, the installed package (the wheel)
        sys.path.insert(0, os.path.join(ROOT, "adapters", "torch", "python"))
    import fabpool_torch
    fabpool_torch.install(args.lib, stats=True)      # the only line a user adds

    # ---- from here on, an ordinary Lightning script
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import DeviceStatsMonitor
        from lightning.pytorch.loggers import CSVLogger
    except ImportError:
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import DeviceStatsMonitor
        from pytorch_lightning.loggers import CSVLogger
    print("lightning", pl.__version__, "torch", torch.__version__)

    vocab, d_model = 8000, 256

    class TinyLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d_model)
            layer = nn.TransformerEncoderLayer(d_model, 8, 4 * d_model, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, vocab)

        def training_step(self, batch, batch_idx):
            x, y = batch[:, :-1], batch[:, 1:]
            logits = self.head(self.enc(self.emb(x)))
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), y.reshape(-1))
            self.log("train_loss", loss)
            self.log("max_memory_allocated_mib", torch.cuda.max_memory_allocated() / 2**20)
            self.log("memory_reserved_mib", torch.cuda.memory_reserved() / 2**20)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-4)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(vocab, (args.steps * 8, 129), generator=g)
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=False)
    logger = CSVLogger(args.out_dir, name="fabpool")
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=args.steps, precision="bf16-mixed",
                         callbacks=[DeviceStatsMonitor()], logger=logger, log_every_n_steps=1,
                         enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(TinyLM(), loader)
    # ---- end of the ordinary script

    ok = True

    def check(cond, what):
        nonlocal ok
        ok = ok and bool(cond)
        print(("PASS " if cond else "FAIL ") + what, flush=True)

    check(trainer.global_step == args.steps, "Lightning trained to its end (%d of %d steps)" %
          (trainer.global_step, args.steps))
    files = glob.glob(os.path.join(logger.log_dir, "metrics.csv"))
    check(bool(files), "Lightning wrote its metrics (%s)" % logger.log_dir)
    rows = []
    if files:
        with open(files[0]) as f:
            rows = list(csv.DictReader(f))
    cols = set(rows[0].keys()) if rows else set()

    def values(pred):
        out = []
        for r in rows:
            for k, v in r.items():
                if pred(k) and v not in ("", None):
                    out.append(float(v))
        return out

    dsm = values(lambda k: "allocated_bytes.all.peak" in k)
    check(len(dsm) > 0 and min(dsm) > 0,
          "DeviceStatsMonitor logged allocated_bytes.all.peak from fabpool (%d values, max %.1f MiB)" %
          (len(dsm), max(dsm) / 2**20 if dsm else 0))
    check(any("reserved_bytes.all.current" in k for k in cols), "DeviceStatsMonitor logged reserved_bytes too")
    mine = values(lambda k: k == "max_memory_allocated_mib")
    check(len(mine) > 0 and min(mine) > 0, "the module logged torch.cuda.max_memory_allocated() (max %.1f MiB)" %
          (max(mine) if mine else 0))
    ms = fabpool_torch.memory_stats(0)
    check(ms["allocated_bytes.all.peak"] == torch.cuda.max_memory_allocated() > 0,
          "torch.cuda.max_memory_allocated() is fabpool's count (%d)" % ms["allocated_bytes.all.peak"])
    c = fabpool_torch.counters(0)
    check(c["allocs"] > 100 and c["bad_frees"] == 0, "the tensors were fabpool's (%d allocations, %d bad frees)" %
          (c["allocs"], c["bad_frees"]))
    print("metric columns:", ", ".join(sorted(k for k in cols if "allocated" in k or "reserved" in k)[:12]))
    print("ALL PASS" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

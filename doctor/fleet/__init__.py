"""gpudoctor.fleet: many GPUs, many nodes.

- `merge`: per-node (or per-rank) scan reports -> one fleet report (missing nodes and ranks, version
  and hardware drift, stragglers, probe verdicts that differ). Pure Python, no torch.
- `readers`: the merge's inputs: report files read in bounded memory, one `Member` per report.
- `model`: the fleet report (`FleetReport`, `FleetFinding`, `Culprit`); `render`: it as text, JSON
  and Markdown; `command`: `gpudoctor merge` and the output side of `scan --distributed`/`--ray`.
- `launch`: what a scan records about the job it ran in (Slurm, torchrun, Ray), the NCCL set-up and
  the network ports of its node.
- `nodelist`: Slurm's compact host lists (`gpu[01-04,07]`), expanded and compressed.
- `distributed`: `gpudoctor scan --distributed` under torchrun (CLI side, no torch); `agent` is its
  torch-side helper, run in a child process of the target interpreter; `collectives` judges what
  the ranks measured.
- `rayscan`: one scan per Ray node through a STRICT_SPREAD placement group (needs ray).

Like the rest of gpudoctor, importing this package does no work: the CLI process never imports
torch, and `gpudoctor explain` must start fast.

May import: the standard library, gpudoctor.scan (`runner` and `environment`: a scan per rank or
node; never `worker`), gpudoctor.reports, gpudoctor.output and gpudoctor.safetext. `agent` runs in
the target interpreter and imports nothing of gpudoctor. Never the CLI layer. Imported by: the CLI
layer, and gpudoctor.scan.environment (`launch`: the job a scan ran in).
"""

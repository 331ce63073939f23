"""Why did STAR's ELBO fall below mean-field's on the extrapolation splits?

    python benchmarks/star_offdiagonal.py [--dataset concrete] [--split 0] [--steps 1500]
        [--every 300] [--variants mean_field,plain,preconditioned] [--seed 0] [--threads 1]
        [--elbo-se 0.01] [--out benchmarks/results/star_offdiagonal.jsonl]
        [--md benchmarks/results/star_offdiagonal.md]

Fits ``build_deep_gp(X, Y, depth=3, posterior=..., num_inducing=100, seed=seed)`` on the
extrapolation split (Lindinger et al.'s protocol, minibatch 512, Adam 0.01, one training sample) for

* ``mean_field``: DSVI's mean-field posterior;
* ``plain``: STAR with the off-diagonal blocks stored as the blocks of ``R`` themselves
  (``precondition_offdiagonal=False``, Lindinger et al.'s parameterisation);
* ``preconditioned``: STAR with the library's default storage (whitened by the row unit's prior
  and divided by the square root of the number of off-diagonal blocks in the row);
* ``plain_stripes`` / ``plain_arrow``: plain STAR with only the stripes / only the arrow.

Every ``--every`` steps it records the ELBO per datapoint on the full training set (estimated until
its standard error is below ``--elbo-se``), the KL per datapoint, the expected log-likelihood per
datapoint (ELBO + KL/N) and the Frobenius norms of the stored stripe and arrow parameters. All
variants share the seed, so they start from the same model (STAR's off-diagonal blocks start at
zero, where it equals mean-field exactly) and see the same minibatches. One JSON line per
(variant, step) is appended to ``--out`` (lines already there are skipped); ``--md`` gets the table,
with this command.
"""

from __future__ import annotations

if not __package__:  # run by path: load benchmarks/ as the package (benchmarks/_by_path.py)
    import _by_path  # noqa: F401  (imported for its side effect)

import argparse
import os
import shlex
import sys
import tempfile
import time

from benchmarks.common import append_line, read_lines, set_threads

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT_OUT = os.path.join(HERE, "results", "star_offdiagonal.jsonl")
DEFAULT_MD = os.path.join(HERE, "results", "star_offdiagonal.md")

#: variant -> (posterior, build options)
VARIANTS = {
    "mean_field": ("mean_field", {}),
    "plain": ("stripes_arrow", {"precondition_offdiagonal": False}),
    "preconditioned": ("stripes_arrow", {"precondition_offdiagonal": True}),
    "plain_stripes": ("stripes_arrow", {"precondition_offdiagonal": False, "arrow": False}),
    "plain_arrow": ("stripes_arrow", {"precondition_offdiagonal": False, "stripes": False}),
}


def _key(rec):
    return (rec["dataset"], rec["split"], rec["variant"], rec["step"], rec["seed"])


def run_variant(args, variant, done, out_path):
    import tensorflow as tf

    from deepgp_gi import datasets
    from deepgp_gi.builders import build_deep_gp
    from deepgp_gi.metrics import estimate_elbo
    from deepgp_gi.training import fit

    posterior, options = VARIANTS[variant]
    data = datasets.load_uci(args.dataset, args.split, protocol="extrapolation")
    D = (data.X_train, data.Y_train)
    N = D[0].shape[0]
    model = build_deep_gp(
        D[0],
        D[1],
        depth=3,
        posterior=posterior,
        num_inducing=100,
        seed=args.seed,
        positive_transform="softplus",
        **options,
    )
    checkpoints = list(range(args.every, args.steps + 1, args.every))
    if all((args.dataset, args.split, variant, s, args.seed) in done for s in checkpoints):
        return

    def norm(p):
        return None if p is None else float(tf.norm(tf.convert_to_tensor(p)))

    with tempfile.TemporaryDirectory() as ckpt:
        t0 = time.perf_counter()
        for step in checkpoints:
            fit(
                model,
                D,
                steps=step,
                batch_size=min(512, N),
                learning_rate=0.01,
                num_samples=1,
                seed=args.seed,
                progress=False,
                checkpoint_dir=ckpt,
            )
            elbo, se, _ = estimate_elbo(model, D, seed=args.seed, se_target=args.elbo_se)
            kl = float(model.posterior.kl_divergence()) / N
            post = model.posterior
            rec = dict(
                dataset=args.dataset,
                split=args.split,
                variant=variant,
                seed=args.seed,
                step=step,
                elbo_per_datapoint=elbo,
                elbo_se=se,
                kl_per_datapoint=kl,
                ell_per_datapoint=elbo + kl,
                stripes_norm=norm(getattr(post, "stripes", None)),
                arrow_norm=norm(getattr(post, "arrow", None)),
                wall_s=round(time.perf_counter() - t0, 1),
            )
            if _key(rec) not in done:
                append_line(out_path, rec)
            print(
                f"{variant} step {step}: ELBO/N {elbo:.3f} KL/N {kl:.3f} ELL/N {elbo + kl:.3f}",
                flush=True,
            )


def write_md(records, md_path, command):
    by = {}
    for r in records:
        by[(r["dataset"], r["split"], r["variant"], r["step"])] = r
    lines = [
        "# STAR's off-diagonal storage against mean-field (extrapolation split, depth 3)",
        "",
        f"Regenerate: `{command}`",
        "",
        "ELBO, KL and expected log-likelihood (ELL = ELBO + KL) per datapoint on the full "
        "training set; norms of the stored stripe and arrow parameters. Same seed, model and "
        "minibatches for every variant.",
        "",
        "| dataset | split | variant | step | ELBO/N | KL/N | ELL/N | stored stripes norm | "
        "stored arrow norm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = list(VARIANTS)
    for k in sorted(by, key=lambda k: (k[0], k[1], order.index(k[2]), k[3])):
        r = by[k]

        def f(v):
            return "—" if v is None else f"{v:.1f}"

        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {r['elbo_per_datapoint']:.3f} | "
            f"{r['kl_per_datapoint']:.3f} | {r['ell_per_datapoint']:.3f} | {f(r['stripes_norm'])} "
            f"| {f(r['arrow_norm'])} |"
        )
    with open(md_path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="concrete")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--every", type=int, default=300)
    p.add_argument("--variants", default="mean_field,plain,preconditioned")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--elbo-se",
        type=float,
        default=0.01,
        help="standard error at which the ELBO estimate stops drawing (default 0.01)",
    )
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--md", default=DEFAULT_MD)
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"--variants: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    if not args.elbo_se > 0:
        p.error(f"--elbo-se must be positive, got {args.elbo_se}")
    if args.steps < args.every or args.every <= 0:
        p.error("--every must be positive and at most --steps")
    set_threads(args.threads)
    done = {_key(r) for r in read_lines(args.out)}
    for v in variants:
        run_variant(args, v, done, args.out)
    command = "python benchmarks/star_offdiagonal.py " + " ".join(
        shlex.quote(a) for a in (argv or sys.argv[1:])
    )
    write_md(read_lines(args.out), args.md, command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

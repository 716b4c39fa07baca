"""Benchmark: building the contention model (max-min fair fat-tree with on/off cross traffic).

Usage::

    python experiments/bench/bench_contention.py                  # writes results/contention.json
    python experiments/bench/bench_contention.py --dense-up-to 4096

Builds :class:`pacectl.fabric.contention.ContentionComm` with the ``paper_like`` cluster's
topology and cross traffic (8 ranks per node, 4 nodes per leaf, 4:1 oversubscription, greedy
bursts 0.4 s on / 1.2 s off on every leaf uplink, staggered) at 1,024 to 65,536 ranks. The build
(``build_s``: construction plus the rates of every state a run can meet) solves the max-min fair
rates of every cross-traffic state of one period (the ring's flows plus
the active cross flows) from the sparse flow-link incidence (each flow crosses 2 to 4 links).

Side by side, up to ``--dense-up-to`` ranks: the same solves from the dense flows x links
incidence (the former construction); each row says whether every state's ring rate was
bit-identical.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from _record import write_record

from pacectl.fabric.contention import ContentionComm, CrossTraffic
from pacectl.fabric.topology import FatTree, max_min_fair

TOPOLOGY = FatTree(ranks_per_node=8, nodes_per_leaf=4, oversubscription=4.0)
CROSS = CrossTraffic(links=("leaf_up:*",), rate_frac=1.0, on_s=0.4, off_s=1.2)


def _dense_rates(model: ContentionComm, num_ranks: int, states: list[tuple[bool, ...]]) -> list[float]:
    names, caps = TOPOLOGY.links(num_ranks)
    ring = TOPOLOGY.ring_flows(num_ranks)
    out = []
    for state in states:
        active = [link for link, on in zip(model._cross_links, state, strict=True) if on]
        extra = np.zeros((len(active), len(caps)), dtype=bool)
        extra[np.arange(len(active)), active] = True
        demand = np.concatenate([np.full(len(ring), np.inf), CROSS.rate_frac * caps[active]])
        rates = max_min_fair(caps, np.vstack([ring, extra]), demand)
        out.append(float(rates[: len(ring)].min()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="*", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--dense-up-to", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "contention.json")
    args = parser.parse_args()
    rows = []
    for n in args.ranks:
        t0 = time.perf_counter()
        model = ContentionComm(TOPOLOGY, n, message_bytes=2e9, cross_traffic=CROSS)
        construct_s = time.perf_counter() - t0
        states = model._states_in_period()
        sparse = [model.ring_rate_Bps(s) for s in states]  # every state a run can meet
        build_s = time.perf_counter() - t0
        row = {
            "num_ranks": n,
            "num_links": len(model._caps),
            "num_ring_flows": int(model._ring.shape[0]),
            "num_states": len(states),
            "construct_s": construct_s,
            "build_s": build_s,
            "timing_dependent": model.timing_dependent,
        }
        if n <= args.dense_up_to:
            t1 = time.perf_counter()
            dense = _dense_rates(model, n, states)
            row["dense_solves_s"] = time.perf_counter() - t1
            row["identical"] = dense == sparse
        rows.append(row)
        print(
            f"{n} ranks: {row['num_ring_flows']} ring flows x {row['num_links']} links, {len(states)} states: "
            f"built with every state solved in {build_s:.2f} s"
            + (
                f"; dense solves {row['dense_solves_s']:.2f} s, identical: {row['identical']}"
                if "identical" in row
                else ""
            ),
            flush=True,
        )
    write_record(
        args.out,
        rows,
        command="python experiments/bench/bench_contention.py " + " ".join(sys.argv[1:]),
        load_average_1_5_15=list(os.getloadavg()),
        note="absolute times depend on the machine's load: read them with load_average_1_5_15",
    )


if __name__ == "__main__":
    main()

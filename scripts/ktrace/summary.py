"""Summary of a kernel trace (scripts/ktrace/ktrace.sh) of a `ds4 bench` run: the decode
phase's second half (steady steps): how busy the GPU was, the time per kernel name, each
kernel's time from its predecessor's end on its stream (what it adds to its lane), the
layers' spans (from one attention-side `hc_pre` to the next), and one CSA layer in order.

    python3 scripts/ktrace/summary.py TRACE.txt[.gz] [--layer [CSA|other]]
"""
import collections, gzip, sys

def load(path):
    op = gzip.open if path.endswith(".gz") else open
    rows = []
    for line in op(path, "rt"):
        s, e, st, name = line.split(maxsplit=3)
        name = name.strip()
        if name.startswith("["):
            name = name.split()[0] + "]"  # copies and fills by kind, not size
        rows.append((int(s), int(e), int(st), name))
    rows.sort()
    # Decode starts after the prefill's last tensor-core matmul; its second half is steady.
    last_mma = max((i for i, r in enumerate(rows) if "mma" in r[3]), default=-1)
    dec = rows[last_mma + 1:]
    return dec[len(dec) // 2:]

def main():
    dec = load(sys.argv[1])
    span = dec[-1][1] - dec[0][0]
    busy, (cs, ce) = 0, dec[0][:2]
    for s, e, _, _ in dec[1:]:
        if s > ce:
            busy, cs, ce = busy + ce - cs, s, e
        else:
            ce = max(ce, e)
    busy += ce - cs
    total, count, lane_add, last_end = collections.Counter(), collections.Counter(), collections.defaultdict(list), {}
    main_stream = collections.Counter(r[2] for r in dec).most_common(1)[0][0]
    for s, e, st, n in dec:
        total[n] += e - s
        count[n] += 1
        lane = st == main_stream
        if lane in last_end and s - last_end[lane] < 20_000:
            lane_add[n].append(e - max(s, last_end[lane]))
        last_end[lane] = e
    print(f"{len(dec)} kernels, span {span / 1e3:.1f} us, GPU busy {busy / 1e3:.1f} us ({100 * busy / span:.1f}%)")
    print(f"{'kernel':40s} {'total us':>10s} {'count':>6s} {'mean us':>8s} {'adds us':>8s}")
    for n, t in total.most_common(24):
        a = sorted(lane_add[n]) or [0]
        print(f"{n[:40]:40s} {t / 1e3:10.1f} {count[n]:6d} {t / count[n] / 1e3:8.2f} {a[len(a) // 2] / 1e3:8.2f}")
    starts = [i for i, r in enumerate(dec) if r[3] == "hc_pre"][0::2]
    kinds = collections.defaultdict(list)
    for a, b in zip(starts, starts[1:]):
        names = {r[3] for r in dec[a:b]}
        kind = "CSA" if names & {"top_k_sort", "top_k_radix", "indexer_scores_vec", "indexer_combine"} else "other"
        kinds[kind].append((dec[b][0] - dec[a][0], a, b))
    for kind, v in sorted(kinds.items()):
        d = sorted(x[0] for x in v)
        print(f"{kind} layers: {len(v)}, median {d[len(d) // 2] / 1e3:.1f} us")
    # --layer [CSA|other]: the median layer of that kind, kernel by kernel.
    want = sys.argv[sys.argv.index("--layer") + 1] if "--layer" in sys.argv[:-1] else "CSA"
    if "--layer" in sys.argv and kinds.get(want):
        _, a, b = sorted(kinds[want])[len(kinds[want]) // 2]
        t0 = dec[a][0]
        for s, e, st, n in dec[a:b]:
            print(f"  {n[:34]:34s} {'main' if st == main_stream else 'side'} {(s - t0) / 1e3:8.2f} {(e - t0) / 1e3:8.2f} {(e - s) / 1e3:7.2f}")

main()

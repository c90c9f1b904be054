#!/usr/bin/env python3
"""Draws docs/images/context_parallel_cp2.svg: how context parallelism splits a window over cp = 2 ranks
(LoadBalancedSplit, parallel/context/load_balanced_split.h) and the ring steps of attention
(parallel/context/context_attention.cpp): which K/V block each rank computes with at each step, and the
blocks causality leaves empty.

Usage: /usr/bin/python3 tools/docs/draw_context_parallel.py > docs/images/context_parallel_cp2.svg
"""
CP = 2
CHUNKS = 2 * CP
COLORS = ["#4e79a7", "#f28e2b"]  # rank 0, rank 1
CELL = 34


def owner(chunk):
    return chunk if chunk < CP else 2 * CP - 1 - chunk


def rank_chunks(rank):
    return [rank, 2 * CP - 1 - rank]


def text(x, y, s, size=12, anchor="start", weight="normal", fill="#222"):
    return (f'<text x="{x}" y="{y}" font-family="sans-serif" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}">{s}</text>')


def rect(x, y, w, h, fill, stroke="#333", opacity=1.0):
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}" fill-opacity="{opacity}" stroke="{stroke}"/>'


def main():
    out = []
    width, height = 860, 330
    out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'viewBox="0 0 {width} {height}">')
    out.append(rect(0, 0, width, height, "white", stroke="none"))
    # The split of one window.
    out.append(text(20, 24, "One window of T positions in 2 cp = 4 chunks; rank r holds chunks r and 2cp - 1 - r",
                    13, weight="bold"))
    x0, y0 = 20, 40
    for c in range(CHUNKS):
        out.append(rect(x0 + c * 90, y0, 90, 30, COLORS[owner(c)]))
        out.append(text(x0 + c * 90 + 45, y0 + 20, f"chunk {c}", 12, "middle", fill="white"))
    out.append(text(x0, y0 + 48, "positions 0 ... T-1  (causal: a query sees keys at or before it)", 11))
    for r in range(CP):
        out.append(rect(400, y0 + r * 24, 14, 14, COLORS[r]))
        chunks = " and ".join(str(c) for c in rank_chunks(r))
        out.append(text(420, y0 + 12 + r * 24, f"rank {r}: chunks {chunks} (equal causal work)", 12))
    # The ring: per rank, its query chunks against each step's K/V block.
    y1 = 120
    out.append(text(20, y1, "Ring attention (parallel.cp_comm = p2p): step s computes with the K/V of rank r - s",
                    13, weight="bold"))
    for r in range(CP):
        bx = 20 + r * 370
        by = y1 + 20
        out.append(text(bx, by + 14, f"rank {r}", 12, weight="bold", fill=COLORS[r]))
        for s in range(CP):
            src = (r - s) % CP
            gx = bx + 60 + s * 150
            out.append(text(gx + 2 * CELL // 2 + 20, by + 14, f"step {s}: K/V of rank {src}", 11, "middle"))
            kchunks = rank_chunks(src)
            qchunks = rank_chunks(r)
            for i, qc in enumerate(qchunks):
                out.append(text(gx - 4, by + 44 + i * CELL, f"q{qc}", 10, "end"))
                for j, kc in enumerate(kchunks):
                    if i == 0:
                        out.append(text(gx + 20 + j * CELL + CELL // 2, by + 30, f"k{kc}", 10, "middle"))
                    cx, cy = gx + 20 + j * CELL, by + 34 + i * CELL
                    if kc > qc:
                        out.append(rect(cx, cy, CELL, CELL, "#eeeeee"))
                        out.append(text(cx + CELL // 2, cy + 21, "skip", 9, "middle", fill="#888"))
                    elif kc == qc:
                        out.append(rect(cx, cy, CELL, CELL, COLORS[src], opacity=0.55))
                        out.append(text(cx + CELL // 2, cy + 21, "diag", 9, "middle"))
                    else:
                        out.append(rect(cx, cy, CELL, CELL, COLORS[src], opacity=0.9))
                        out.append(text(cx + CELL // 2, cy + 21, "full", 9, "middle", fill="white"))
        if CP > 1:
            out.append(text(bx + 60, by + 130, f"sends its block to rank {(r + 1) % CP}, receives from rank {(r - 1) % CP}",
                            11, fill="#555"))
    out.append(text(20, 300, "full: every key before every query (masked by documents only); diag: causal inside the chunk; "
                             "skip: every key after every query, never computed.", 11, fill="#555"))
    out.append(text(20, 318, "The steps merge by the log-sum-exp rule; the backward passes each block on "
                             "with its dK/dV accumulator, which a last step brings home.", 11, fill="#555"))
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main()

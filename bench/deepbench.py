"""DeepBench's GEMM training set (baidu-research/DeepBench, code/kernels/gemm_problems.h,
``training_set``): 160 problems (M, N, K, A transposed, B transposed), C = op(A) · op(B) with
op(A) M×K and op(B) K×N. Built here from the set's structure; the test
tests/unit/test_remote_api_bench.py checks the count and a few entries against the header."""

from __future__ import annotations

Problem = tuple[int, int, int, bool, bool]


def training_set() -> list[Problem]:
    """The 160 DeepBench training GEMMs as (m, n, k, a_t, b_t)."""
    out: list[Problem] = []
    ft = (False, True)
    for at in ft:
        for d in (1760, 2048, 2560, 4096):
            out += [(d, n, d, at, False) for n in (16, 32, 64, 128, 7000)]
    out += [(d, 7133, d, False, True) for d in (1760, 2048, 2560, 4096)]
    for at in ft:
        for k in (1760, 2048, 2560, 4096):
            out += [(5124, 9124, k, at, False), (35, 8457, k, at, False)]
    for at in ft:
        out += [(7680, n, 2560, at, False) for n in (16, 32, 64, 128)]
    for at in ft:
        out += [(3072, n, 1024, at, False) for n in (16, 32, 64, 128)]
    out += [(3072, 7435, 1024, False, True), (7680, 5481, 2560, False, True)]
    for at in ft:
        out += [(m, n, 500000, at, False) for (m, n) in ((512, 8), (1024, 8), (512, 16), (1024, 16))]
    out += [(1024, 700, 512, False, False), (1024, 700, 512, True, False)]
    big = ((7680, 2560), (6144, 2048), (4608, 1536), (8448, 2816), (3072, 1024))
    for at in ft:
        for n in (24000, 48000):
            out += [(m, n, k, at, False) for (m, k) in big]
    for at in ft:
        for n in (16, 32):
            out += [(m, n, k, at, False) for (m, k) in ((6144, 2048), (4608, 1536), (8448, 2816))]
    for n, small in ((24000, 16), (48000, 32)):
        for at in ft:
            out += [(m, n, k, at, False) for m in (512, 1024) for k in (2816, 2048, 2560, 1536)]
        out += [(512, small, 512, False, False), (1024, small, 512, False, False),
                (512, small, 512, False, True), (1024, small, 512, False, True)]
    return out


#: The 10 shapes of earlier runs (a sample of the set, all untransposed), kept for comparisons.
SAMPLE = [(1760, 16, 1760, False, False), (1760, 128, 1760, False, False), (2560, 64, 2560, False, False),
          (4096, 7000, 4096, False, False), (5124, 9124, 2560, False, False), (7680, 64, 2560, False, False),
          (3072, 128, 1024, False, False), (7680, 5481, 2560, False, False), (1024, 700, 512, False, False),
          (8448, 48000, 2816, False, False)]

"""bench/kernels/sass_mix.py: the gemv's instructions per weight tile, read from SASS text.

A small cuobjdump listing stands in for the compiler's: one gemv instantiation (bf16, MT 1,
U 2) whose loop body holds two tiles, and a kernel of another name that is passed over.
"""

from __future__ import annotations

import pytest
import sass_mix as sm

GEMV = "_ZN4fp4k15fp4_gemv_kernelILb1ELi1ELi2EEEvNS_10GemvParamsE"
TILE = """\
        /*{a}0*/                   LDSM.16.M88.2 R96, [R72] ;          /* 0x000000ff0b4f7983 */
        /*{a}1*/                   IMAD.SHL.U32 R1, R2, 0x10, RZ ;     /* 0x00000010ff017824 */
        /*{a}2*/                   LOP3.LUT R3, R1, 0x81c081c0, RZ, 0xc0, !PT ;
        /*{a}3*/                   IMAD R4, R3, 0x1040, RZ ;
        /*{a}4*/                   HMUL2.BF16_V2 R5, R4, R6.H0_H0 ;
        /*{a}5*/              @!P3 LDG.E.NA.LTC256B.128.CONSTANT R28, desc[UR10][R74.64] ;
        /*{a}6*/                   IADD3 R7, R7, 0x1, RZ ;
        /*{a}7*/                   HMMA.16816.F32.BF16 R64, R76, R96, R64 ;
        /*{a}8*/                   HMMA.16816.F32.BF16 R60, R80, R96, R60 ;
        /*{a}9*/                   HMMA.16816.F32.BF16 R56, R84, R96, R56 ;
        /*{a}a*/                   HMMA.16816.F32.BF16 R68, R72, R96, R68 ;
        /*{a}b*/               @P4 BRA 0x3c00 ;
"""
SASS = f"""
\tcode for sm_90
\t\tFunction : {GEMV}
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
{TILE.format(a="010")}{TILE.format(a="020")}\
        /*0300*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0310*/                   EXIT ;
\t\tFunction : _ZN4fp4k14dequant_kernelEv
        /*0000*/                   HMMA.16816.F32.BF16 R64, R76, R96, R64 ;
        /*0010*/                   EXIT ;
"""


def test_the_body_is_counted_per_tile_and_classified():
    found = sm.functions(SASS)
    assert set(found) == {GEMV, "_ZN4fp4k14dequant_kernelEv"}
    mix = sm.mix(GEMV, found[GEMV])
    assert (mix.dtype, mix.mt, mix.u, mix.tiles_in_body) == ("bf16", 1, 2, 2)
    assert mix.instructions == 2 + 2 * 12 + 2
    assert mix.per_tile == 12.0  # first LDSM to the barrier after the last HMMA, over 2 tiles
    assert mix.per_tile_by_class == {
        "address / add": 1.0,
        "bit ops": 2.0,
        "control": 1.0,
        "half multiply": 1.0,
        "integer multiply": 1.0,
        "memory": 2.0,
        "mma": 4.0,
    }


def test_the_ceiling_is_bytes_over_issue_time():
    mix = sm.mix(GEMV, sm.functions(SASS)[GEMV])
    device = {"sms": 1, "clock_ghz": 1.0, "bandwidth_tb_s": 1e-3}  # 1 GB/s, 4 issues per ns
    # a tile: 576 B take 576 ns at the roofline; 12 instructions at rate r take 3 / r ns
    assert mix.ceiling(1.0, device) == 1.0
    assert mix.ceiling(3 / 576 / 2, device) == pytest.approx(0.5)


def test_a_kernel_without_its_loop_is_refused_by_name():
    ops = sm.functions(SASS)[GEMV]
    with pytest.raises(ValueError, match="no LDSM before the first HMMA"):
        sm.mix(GEMV, [op for op in ops if not op.startswith("LDSM")])
    with pytest.raises(ValueError, match="not an fp4_gemv_kernel"):
        sm.mix("_ZN4fp4k14dequant_kernelEv", ops)

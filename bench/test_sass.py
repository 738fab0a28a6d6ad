"""CPU checks of bench/sass.py: the cubin cut out of a host object, and the loops read off SASS."""
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass  # noqa: E402


def nvidia_elf(payload: bytes) -> bytes:
    """A 64-bit ELF of e_machine 190: its header, `payload` as one section's bytes, then the
    section table (a null section and that one)."""
    header_size, shentsize = 64, 64
    shoff = header_size + len(payload)
    header = bytearray(header_size)
    header[0:4] = b"\x7fELF"
    struct.pack_into("<H", header, 18, sass.CUDA_MACHINE)
    struct.pack_into("<QQ", header, 0x20, 0, shoff)
    struct.pack_into("<HHHH", header, 0x36, 56, 0, shentsize, 2)
    null = bytes(shentsize)
    section = bytearray(shentsize)
    struct.pack_into("<I", section, 4, 1)  # SHT_PROGBITS
    struct.pack_into("<QQ", section, 0x18, header_size, len(payload))
    return bytes(header) + payload + null + bytes(section)


def test_embedded_cubin_is_cut_to_its_section_table():
    cubin = nvidia_elf(b"\x11" * 100)
    host = b"\x7fELF" + b"\0" * 60 + b"host code" + cubin + b"trailing host data"
    assert sass.embedded_cubin(host) == cubin


def test_an_object_without_a_cuda_elf_has_none():
    other = bytearray(nvidia_elf(b"x"))
    struct.pack_into("<H", other, 18, 62)  # x86-64
    assert sass.embedded_cubin(b"\x7fELF" + b"\0" * 60 + bytes(other)) is None


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SHFL.IDX PT, R4, R13, R20, 0x1f ;
        /*0020*/                   IMAD.WIDE R6, R4, 0x1000, R2 ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R41], desc[UR24][R6.64], P0 ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R41+0x2000], desc[UR24][R6.64+0x80], P0 ;
        /*0050*/               @P1 BRA `(.L_x_1) ;
        /*0060*/                   BRA `(.L_x_2) ;
.L_x_2:
        /*0070*/                   EXIT ;
"""


def test_loops_are_backward_branches_with_their_opcodes():
    found = sass.loops(SASS, ["LDGSTS", "SHFL", "IMAD"])
    assert found == [{"start": 1, "end": 5, "length": 5, "LDGSTS": 2, "SHFL": 1, "IMAD": 1}]


def test_bad_input_is_named_and_the_cache_untouched(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="no such file"):
        sass.main(["cache", str(tmp_path / "missing.db"), "--kernel", "%", "--out", str(tmp_path / "o")])
    not_a_cache = tmp_path / "other.db"
    not_a_cache.write_bytes(b"not sqlite at all, " * 100)
    with pytest.raises(SystemExit, match="not a readable moeblaze cache"):
        sass.main(["cache", str(not_a_cache), "--kernel", "%", "--out", str(tmp_path / "o")])
    assert not_a_cache.read_bytes() == b"not sqlite at all, " * 100
    with pytest.raises(SystemExit, match="not a directory"):
        sass.main(["quack", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="no such file"):
        sass.main(["loops", str(tmp_path / "missing.sass")])

"""Logical shards of the sharded key layout: which shard a session is in, and each shard's hash tag.

Sessions fall into :data:`SHARDS` logical shards by the CRC-32 of their session key (stable across processes and
releases, unlike Python's salted ``hash``). Shard ``n``'s hash tag is :data:`TAGS` ``[n]``, a short tag chosen so its
keys sit in cluster slot ``16 * n`` exactly: moving slots ``0-5455`` between nodes moves shards ``0-340`` whole.
The table is pinned; :func:`generate_tags` computes it again and a test checks the two agree.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

__all__ = ["SHARDS", "SLOTS_PER_SHARD", "TAGS", "generate_tags", "shard_of", "shard_tag"]

SHARDS = 1024
"""How many logical shards; fixed, since it decides every session's key names."""

SLOTS_PER_SHARD = 16
"""Redis Cluster's 16,384 slots over :data:`SHARDS`: shard ``n`` sits in slot ``16 * n``."""

# fmt: off
TAGS: tuple[str, ...] = (
    "s7920", "sec8", "s1792", "s49a0", "s539", "s85af", "saca1", "s12cc", "s11dd8", "s48f", "sa4e", "s12d78",
    "s1b7", "s11449", "s10718", "s1dd", "s6824", "s5d27", "s3cf5", "s58a4", "s10ff", "s199f", "s87dc", "s205f",
    "s8b", "s7c58", "sc73", "s28a9", "s3aa", "sdb28", "sa099", "s4369", "s78d9", "sd51", "s192", "s8f2", "s4e0",
    "sbbd8", "sab78", "s4cc", "s9c52", "s128f", "s3dbd", "s3874", "s17b7", "s80fa", "saff6", "s17dd", "s8fd8",
    "s1d5e9", "sf04", "s9ea9", "s6ff", "se4", "s9518", "s1ef09", "s19d0", "s2ed3", "s1e73", "s19bc", "s15aa",
    "s82e7", "s82cd", "s252a", "s7d58", "s8d0", "s8bc", "sd73", "sde28", "s4aa", "s4469", "sa799", "s5c27", "s3856",
    "s383e", "s3df5", "s80b0", "s17ff", "s275f", "s4987", "s38f", "s11cd8", "s12c78", "sf4e", "sae", "s6b7", "s6dd",
    "s10018", "sbc8", "s2952", "s19f2", "s1092", "s82af", "s239", "s15cc", "s5883", "s2bd3", "s929", "s49ea",
    "s1b73", "s85e7", "s12aa", "s222a", "s85cd", "s11859", "s8ad8", "s9ba9", "sa04", "s89f", "s1ff", "s16988",
    "s9218", "s158f", "s58c6", "s58ee", "s3cbd", "s87fa", "s10b7", "s10dd", "saaf6", "sc51", "sb549", "sc618",
    "s692", "sbed8", "s3e0", "s3cc", "sae78", "s10209", "s4ee", "s4c6", "s11158", "sd5d", "s12a69", "s11ae9",
    "sd37", "s80f4", "s17bb", "s17d1", "s93c5", "s1283", "s3812", "s387a", "s3db1", "sea", "s6f3", "s5529", "sc2",
    "sf62", "se4f9", "sd7c8", "sf0a", "s82eb", "s15a4", "s2524", "s82c1", "s1e15", "s19de", "s19b6", "s1e7f",
    "s85a3", "s12ee", "s12c6", "s96d2", "s1b5d", "s792e", "s49ae", "s1b37", "se689", "s1bb", "s1d1", "s400fb",
    "s483", "sa7f8", "sb758", "sa40", "s1993", "s10f3", "s2053", "s87d6", "s5182", "s682a", "s58aa", "s5d41",
    "s9009", "s3a4", "s1fcb8", "s8358", "sc15", "s87", "s8ce9", "sc7f", "s12a4", "s85eb", "s85c1", "s2224", "s7964",
    "s1b15", "s1b7f", "s49e4", "s1f3", "s893", "sfce8", "s5229", "se3f9", "sa62", "sa0a", "s39e9", "s10bb", "s87f4",
    "s94c5", "s728", "s58cc", "s1583", "s3cb1", "s58e0", "s3ee", "s10509", "s11658", "s3c6", "s12f69", "sc5d",
    "sc37", "s11fe9", "s4a4", "s9709", "s8458", "s1fdb8", "s8de", "sd15", "sd7f", "s8b6", "s17f3", "s80be", "s498b",
    "s2753", "s385c", "s5682", "s5c41", "s3830", "s6bb", "sa0", "s407fb", "s6d1", "sa0f8", "s383", "sf40", "s5939",
    "s15ee", "s82a3", "s588f", "s15c6", "s8b12", "s1e5d", "s1e37", "s2934", "s9cb", "se62", "se0a", "s9e1", "s5f3",
    "sa688", "sdd39", "s5629", "s392d", "s1f15", "s1f7f", "s3947", "s16a4", "s4896", "s81c1", "s2624", "s12b69",
    "s9819", "s179b8", "s11be9", "s7ee", "s10109", "s11258", "s7c6", "s8c65", "s1183", "scb9", "s2843", "s14bb",
    "s5992", "s90c5", "s328", "s7813", "s1c62", "s1c0a", "s838", "s13f3", "s84be", "s84d6", "s2353", "s12088",
    "s1cb98", "s11948", "s15ae8", "s16899", "s9309", "s8058", "s1dc49", "s59dd", "s1a5d", "s1a37", "s59b7", "s11ee",
    "s86a3", "s95d2", "s11c6", "sa4f8", "s783", "sb40", "sb458", "s2bb", "sad69", "sbde9", "s2d1", "s1683", "s785b",
    "s48fb", "sdb9", "s84f4", "s13bb", "s428", "s97c5", "s1a4a8", "s12e69", "s11ee9", "s1b428", "s10609", "s1ad19",
    "s1bdb9", "s11558", "s1a15", "s695f", "s59ff", "s1a7f", "s86eb", "s11a4", "s2124", "s86c1", "sb62", "se0f9",
    "s1938", "sb0a", "sa188", "s2f3", "s5129", "sdc39", "se2c", "s4968", "s79e8", "se40", "sac69", "s5bb", "s5d1",
    "sbce9", "s1f5d", "s3965", "s390f", "s1f37", "s81a3", "s16ee", "s16c6", "s92d2", "s1ce98", "s12788", "s15fe8",
    "s1d4d8", "s9409", "s7a4", "s1dd49", "s8758", "s1d62", "s18cb", "s18e1", "s1d0a", "s83be", "s14f3", "s2453",
    "s83d6", "s84b0", "s13ff", "s235f", "s84dc", "s2cc4", "s48d5", "s48bf", "s1c04", "sda28", "s5338", "s4069",
    "s982", "s5cc9", "s38d8", "s41b62", "s6c09", "s86af", "s639", "s11cc", "s68", "sfc8", "s59d1", "s59bb", "s1492",
    "s11749", "s2b7", "s2dd", "s10418", "s78f", "s13d29", "s10da9", "sb4e", "s8549", "s5ff", "s1ee09", "s9618",
    "s1d6e9", "s9c7", "s9ed", "se04", "s489c", "s16aa", "s262a", "s81cd", "s2fd3", "s3921", "s394b", "s1f73",
    "sbad8", "s7e0", "s7cc", "saa78", "s3c59", "s5828", "s68a8", "s292", "s83fa", "s14b7", "s14dd", "saef6",
    "s118f", "s2825", "s18a5", "s1d4e", "s5b7", "s11049", "s10318", "s5dd", "s13c29", "se26", "se4e", "s9a5",
    "s139", "s81af", "scd70", "s16cc", "s978e", "sac8", "s1392", "s3903", "s7aa", "sdf28", "sa499", "s4769",
    "sd6b9", "s5dc9", "s6d09", "s41e62", "s14ff", "s83b0", "s83dc", "s245f", "s18c7", "s2dc4", "s1d04", "s18ed",
    "s13b7", "s84fa", "sabf6", "s13dd", "s7857", "s168f", "s1c4e", "s48f7", "s1739", "sbfd8", "saf78", "s4e88",
    "sb649", "s3d59", "s592", "sc518", "s11aa", "s86e7", "s1882", "s212a", "s6953", "s2ad3", "s1a73", "s59f3",
    "s2ff", "s8249", "s9118", "s1eb09", "s8bd8", "s138c8", "sb04", "s9aa9", "sf7f", "s8fe9", "s12688", "sf15",
    "sd5", "s1de49", "s6a4", "sbf", "s1e0a", "s19e1", "s19cb", "s1e62", "s82d6", "s2553", "s15f3", "s82be", "sd40",
    "s78e8", "s4868", "s183", "sbbe9", "s4d1", "s4bb", "sab69", "s3de6", "s380f", "s3865", "s3dce", "s93d2",
    "s17c6", "s17ee", "s80a3", "s519f", "s58ff", "s685f", "s5d5e", "s87c1", "s2024", "s10a4", "s87eb", "sc0a",
    "s9c", "se1f9", "sc62", "sdb39", "s5029", "s3f3", "sa088", "seb9", "s49fb", "s795b", "s1783", "s96c5", "s528",
    "s12bb", "s85f4", "sa37", "s11de9", "s12d69", "sa5d", "s11458", "s1c6", "s1ee", "s10709", "s58b7", "s3ce6",
    "s3cce", "s58dd", "s10c6", "s94d2", "s87a3", "s10ee", "sb558", "sc40", "s683", "sa5f8", "s3d1", "sbee9",
    "sae69", "s3bb", "s938", "s1b0a", "s1b62", "s7913", "s2253", "s85d6", "s85be", "s12f3", "s8ae9", "sa7f", "sa15",
    "s12188", "s1db49", "s8158", "s9209", "s1a4", "s11ce9", "sf37", "sf5d", "s12c69", "s6c6", "s11358", "sf7",
    "s6ee", "s2943", "sbb9", "s1083", "s8b65", "s228", "s91c5", "s5892", "s15bb", "s8e1", "sd0a", "sd62", "s8cb",
    "s5729", "sde39", "sa788", "s4f3", "s3847", "s569f", "s5c5e", "s382d", "s2724", "s80c1", "s4996", "s17a4",
    "s202a", "s1982", "s87e7", "s10aa", "s58f3", "s3ca2", "s5d50", "s6853", "s1ec09", "s9018", "s8349", "s3ff",
    "s96", "sc04", "s139c8", "s8cd8", "s12dd", "sacf6", "s85fa", "s12b7", "s49f7", "s1b4e", "s178f", "s7957",
    "s1cc", "scda9", "s413d1", "s1e0", "sc418", "s492", "sa51", "sb749", "s4669", "sa599", "sb3", "s6aa", "s41d62",
    "sf73", "s5ec9", "sd7b9", "s255f", "s82dc", "s82b0", "s15ff", "s19ed", "s1e04", "s2ec4", "s19c7", "s4dd",
    "s10218", "s11149", "s4b7", "s8a5", "sd4e", "s18f", "s11ad8", "s17cc", "safa1", "s80af", "s17e0", "s3803",
    "s1292", "s3dc0", "s968e", "scca9", "s6cc", "s6e0", "sfb", "s392", "s69a8", "s5928", "sf51", "sadf6", "s15dd",
    "s15b7", "s82fa", "s1e4e", "s19a5", "s2925", "s108f", "s9718", "s1ed09", "s4ff", "s8449", "sd04", "s8ed",
    "s8c7", "s1d7e9", "s80cd", "s272a", "s17aa", "s499c", "s3da2", "s384b", "s3821", "s5c50", "saaa1", "s10cc",
    "s739", "s87af", "s1592", "s58bb", "s58d1", "s3cc0", "s10518", "s3dd", "s3b7", "s11649", "sc4e", "s10ea9",
    "s11fd8", "s68f", "s85dc", "s225f", "s12ff", "s85b0", "s1b04", "s49bf", "s49d5", "s2bc4", "s882", "s4169",
    "s1aa", "sfcd9", "sa73", "s41c62", "s39d8", "s5bc9", "s1a4e", "s59ee", "s59c6", "s148f", "sb595", "s11dd",
    "s11b7", "s86fa", "s792", "sc718", "sb449", "sb51", "sad78", "s2cc", "s2e0", "sbdd8", "s1c73", "s48ea", "s829",
    "s2cd3", "s84cd", "s232a", "s13aa", "s84e7", "s129f9", "s9ca9", "s15ad9", "s11959", "s9318", "s16888", "s1dc58",
    "s99f", "s9808", "s10aa9", "s11bd8", "s28f", "s10118", "s7dd", "s7b7", "s11249", "s1192", "s18f2", "s2852",
    "scc8", "s5983", "s14cc", "s339", "s83af", "se73", "s9bc", "s9d0", "s5fc9", "sa699", "s4569", "s5aa", "sdd28",
    "s1f04", "s393e", "s3956", "s2fc4", "s4887", "s265f", "s16ff", "s81b0", "s9da9", "s1ce89", "s1d4e9", "s15fd9",
    "s20839", "s9418", "s8749", "s7ff", "s18bc", "s1d73", "s2dd3", "s18d0", "s242a", "s83cd", "s83e7", "s14aa",
    "s9f2", "se3b", "se51", "s79d9", "s5cc", "sac78", "sbcd8", "s5e0", "s3974", "s1f4e", "s138f", "s9b52", "s16dd",
    "sb295", "s81fa", "s16b7", "s59a4", "s1a04", "s2ac4", "s6924", "s215f", "s86dc", "s189f", "s11ff", "s29a9",
    "sb73", "s5ac9", "s1929", "s4269", "sa199", "sdc28", "s2aa", "s48a0", "s1692", "sdc8", "s7820", "s13cc",
    "saba1", "s84af", "s439", "s10fa9", "s1c768", "s58f", "s11ed8", "s1ad08", "s10618", "s11549", "s1bdc8", "s7d1",
    "sbae9", "saa69", "s7bb", "s5839", "s3c48", "s283", "sa1f8", "s14c6", "s598f", "s83a3", "s14ee", "s2834",
    "s1d37", "s1d5d", "s8c12", "s1df49", "s8558", "s9609", "s5a4", "s9b6", "se7f", "se15", "s9de", "s2653", "s488b",
    "s81be", "s16f3", "s3930", "s1f0a", "s1f62", "s395c", "s628", "s95c5", "s79", "s11bb", "s59e0", "sfb9", "s1483",
    "s9", "s2c6", "s11758", "s10409", "s2ee", "s13d38", "sb37", "sb5d", "s16689", "s2324", "s84c1", "s84eb",
    "s13a4", "s48e4", "s1c7f", "s1c15", "s7864", "s5329", "sda39", "s993", "s4078", "s38e9", "s5cb8", "s6c18",
    "se2f9", "s86d6", "s2153", "s11f3", "s1893", "s1a0a", "s59aa", "s692a", "s1a62", "s8258", "s1da49", "s2a4",
    "s9109", "sb7f", "s8be9", "s12288", "sb15", "s97d2", "s13c6", "s13ee", "s84a3", "s1c37", "s48ae", "s782e",
    "s1c5d", "sbfe9", "s1728", "s27a8", "saf69", "s3d48", "sb658", "sa6f8", "s583", "sdf39", "s5429", "s7f3",
    "sa488", "s5db8", "sd6c8", "se5f9", "s6d18", "s83c1", "s2424", "s14a4", "s83eb", "s1d7f", "s18b6", "s18de",
    "s1d15", "s11058", "s5c6", "s5ee", "s10309", "se37", "s13c38", "s16189", "se5d", "s92c5", "s128", "s16bb",
    "s81f4", "sab9", "s397a", "s3912", "s1383",
)
"""Shard ``n``'s hash tag: the first ``s<hex>`` (counting up from ``s0``) whose slot is ``16 * n``."""
# fmt: on


def generate_tags() -> tuple[str, ...]:
    """The table :data:`TAGS` pins, computed again (about 270,000 CRC16s; for the test and for review)."""
    from redis.crc import key_slot  # only here: the table itself needs no redis import

    found: dict[int, str] = {}
    candidate = 0
    while len(found) < SHARDS:
        tag = f"s{candidate:x}"
        slot = key_slot(tag.encode())
        if slot % SLOTS_PER_SHARD == 0:
            found.setdefault(slot // SLOTS_PER_SHARD, tag)
        candidate += 1
    return tuple(found[n] for n in range(SHARDS))


@lru_cache(maxsize=65536)
def shard_of(session: str) -> int:
    """The logical shard of ``session``: CRC-32 of its UTF-8 key, modulo :data:`SHARDS`."""
    return zlib.crc32(session.encode()) % SHARDS


def shard_tag(session: str) -> str:
    """The hash tag (without braces) of ``session``'s shard."""
    return TAGS[shard_of(session)]

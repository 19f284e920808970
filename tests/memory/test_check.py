"""``switchboard check`` says which memory store and embeddings the workers use, and what keeps them from starting."""

from __future__ import annotations

from pathlib import Path

from tests.erase.test_canary import sb


def test_check_names_the_memory_store_and_its_embeddings(base_env: dict[str, str]) -> None:
    plain = sb("check", env=base_env)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    memory = Path(base_env["SWITCHBOARD_DATA_DIR"]) / "memory"
    assert f"memory:      sqlite in {memory}, embeddings local (local-hash-1, 384 dims)\n" in plain.stdout

    config = Path(base_env["SWITCHBOARD_CONFIG"])
    config.write_text(
        config.read_text()
        + "memory:\n  store: postgres\n  dsn_env: MEMORY_DSN\n"
        + "  embeddings: {provider: openai, api_key_env: EMBED_KEY}\n"
    )
    unset = sb("check", env=base_env)
    assert unset.returncode == 1
    assert "memory:      postgres at $MEMORY_DSN, embeddings misconfigured (see problems)\n" in unset.stdout
    assert "  - memory.dsn_env: MEMORY_DSN is unset or empty\n" in unset.stdout
    assert "  - memory.embeddings: provider openai needs its key in EMBED_KEY\n" in unset.stdout

    ready = sb("check", env={**base_env, "MEMORY_DSN": "postgresql://app@db/app", "EMBED_KEY": "placeholder"})
    assert ready.returncode == 0, ready.stdout + ready.stderr
    line = "memory:      postgres at $MEMORY_DSN, embeddings openai (text-embedding-3-small, 1536 dims)\n"
    assert line in ready.stdout
    assert "postgresql://app@db/app" not in ready.stdout  # the DSN may hold a password: only its variable is named

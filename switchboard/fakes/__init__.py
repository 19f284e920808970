"""Fakes of platform APIs at their HTTP boundary, speaking the real wire format.

They serve the test suite, the benchmarks and ``switchboard simulate`` (which is why they ship in the
package rather than under ``tests/``). None of them is used when real credentials are configured.
"""

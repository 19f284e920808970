"""A text-only test channel: one module (``channel.py``), its fake (``fake.py``), registered in a test only."""

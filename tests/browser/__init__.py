"""End-to-end tests of the web chat page in real headless Chromium."""

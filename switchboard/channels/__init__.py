"""① and ⑤: the only code that knows platform formats. One module per channel."""

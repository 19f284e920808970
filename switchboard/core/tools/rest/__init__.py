"""Custom REST tools: narrow operations declared in the YAML file, run through the tool gateway and egress."""

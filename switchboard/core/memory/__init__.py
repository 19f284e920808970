"""Memory that outlives a conversation: projects of facts with provenance, shared by the agents connected to them."""

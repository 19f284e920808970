"""The renderers as they were before `switchboard/channels/render/`: the oracle of the differential test."""

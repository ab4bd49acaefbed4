"""The data layer: tables, features, the feature cache, lengths, samplers and DataLoader factories."""

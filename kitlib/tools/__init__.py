"""Tools around the kit: the Kaggle kernel builder and the offline demo data."""

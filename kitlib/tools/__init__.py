"""Tools around the kit: the Kaggle kernel builder and the offline demo data (reviews; a text-to-SQL shop)."""

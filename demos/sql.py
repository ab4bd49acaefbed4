"""An offline text-to-SQL demo competition: questions about a small shop, answered by SQLite queries.

    paths = make_sql_demo("sqldemo")                          # shop.sqlite + train/test/sample_submission/solution
    score_sql(paths.solution, "submission.csv", paths.db)     # mean record F1 (sql_metric.py)

``shop.sqlite`` holds three tables (``SCHEMA``: customers, products, orders) generated from ``seed``. The questions
come from ``TEMPLATES`` (filters, counts, aggregates with GROUP BY / HAVING, ORDER BY + LIMIT, joins, a subquery),
each with several paraphrases, their slots (city, category, product, customer, year, month, a price, ...) filled
with values drawn from the data; a slot choice whose gold query returns nothing (or only NULL) is drawn again, so
every gold query executes and answers something. The split is by slot value: each slot's values are divided into
a train pool and a held-out test pool, so test.csv asks the same templates about values no training question
mentions. solution.csv holds the gold queries: only scoring reads it. Standard library + numpy/pandas only.

The metric is the demo's own, a user's metric file to kitlib: the writer copies ``sql_metric.py`` (``METRIC_FILE``)
into the folder, and 00's parameters name it by full path (``metric = "<folder>/sql_metric.py:record_f1"``: each
row's record F1, both queries run read-only, timed and row-capped on the one SQLite file in ``data_dir``).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import sqlite3
import string
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from demos import DemoPaths, prepare_demo_dir, write_csv
from demos.sql_metric import mean_record_f1
from kitlib._files import fsync_dir, fsync_file, write_atomic
from kitlib.tasks.baseline import most_common
from kitlib.tasks.scoring import read_matched, read_scored

DB_FILE = "shop.sqlite"
METRIC_FILE = "sql_metric.py"  # the demo's metric (demos/sql_metric.py), copied beside its data
PARAMETERS = {"task": "seq2seq", "text": "question", "target": "query"}  # 00's, demo.json; + metric: parameters()
PLACEHOLDER_QUERY = "SELECT 1"  # sample_submission.csv: valid SQL, (almost) never the answer
TEST_SHARE = 0.25  # of each slot's values, held out for test.csv (split="values")
Split = Literal["questions", "values"]
FIRST_YEAR, LAST_YEAR = 2019, 2024
N_CUSTOMERS, N_ORDERS = 300, 3000
_TRIES = 40  # slot draws per row before settling for a repeated question

SCHEMA = """\
CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    signup_year INTEGER NOT NULL
);
CREATE TABLE products (
    product_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    category TEXT NOT NULL,
    price REAL NOT NULL
);
CREATE TABLE orders (
    order_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (customer_id),
    product_id INTEGER NOT NULL REFERENCES products (product_id),
    quantity INTEGER NOT NULL,
    order_date TEXT NOT NULL,  -- YYYY-MM-DD
    status TEXT NOT NULL
);
CREATE INDEX orders_customer ON orders (customer_id);
CREATE INDEX orders_product ON orders (product_id);
CREATE INDEX orders_date ON orders (order_date);
"""

CITIES = {
    "USA": ("New York", "Chicago", "Austin", "Seattle"),
    "Canada": ("Toronto", "Vancouver", "Montreal"),
    "UK": ("London", "Manchester", "Leeds"),
    "Germany": ("Berlin", "Munich", "Hamburg"),
    "France": ("Paris", "Lyon", "Marseille"),
    "Spain": ("Madrid", "Barcelona", "Valencia"),
    "Italy": ("Rome", "Milan", "Naples"),
    "Japan": ("Tokyo", "Osaka", "Kyoto"),
    "Australia": ("Sydney", "Melbourne"),
}
# category: (price range in dollars, product nouns)
CATALOGUE: dict[str, tuple[tuple[float, float], tuple[str, ...]]] = {
    "Electronics": ((20, 300), ("Wireless Earbuds", "Bluetooth Speaker", "USB-C Charger", "Smart Watch", "E-Reader",
                                "Webcam")),
    "Kitchen": ((8, 150), ("Chef Knife", "Cutting Board", "Coffee Grinder", "Cast Iron Skillet", "Electric Kettle",
                           "Spice Rack")),
    "Books": ((8, 45), ("Mystery Novel", "Cookbook", "Travel Guide", "Poetry Collection", "Graphic Novel",
                        "History Atlas")),
    "Toys": ((5, 80), ("Building Blocks", "Puzzle Cube", "Toy Train", "Plush Bear", "Stunt Kite", "Board Game")),
    "Garden": ((5, 60), ("Garden Hose", "Pruning Shears", "Flower Seeds", "Watering Can", "Bird Feeder",
                         "Garden Gloves")),
    "Sports": ((6, 150), ("Yoga Mat", "Tennis Racket", "Running Shoes", "Water Bottle", "Dumbbell Set", "Jump Rope")),
    "Beauty": ((4, 90), ("Face Cream", "Shampoo", "Lip Balm", "Hair Dryer", "Perfume", "Nail Polish")),
    "Office": ((3, 60), ("Desk Lamp", "Notebook", "Fountain Pen", "Stapler", "Desk Organizer", "Whiteboard")),
    "Clothing": ((10, 120), ("Wool Scarf", "Rain Jacket", "Denim Jeans", "Baseball Cap", "Hiking Socks", "Sweater")),
    "Pet Supplies": ((5, 200), ("Dog Leash", "Cat Tree", "Pet Bed", "Chew Toy", "Bird Cage", "Fish Tank")),
}  # fmt: skip
BRANDS = ("Aurora", "Nimbus", "Vertex", "Maple", "Orbit", "Cobalt", "Juniper", "Summit", "Harbor", "Pixel", "Willow")
FIRST_NAMES = (
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Lucas", "Mia", "Leon", "Sofia", "Mateo", "Hana", "Kenji", "Chloe",
    "Hugo", "Amelia", "Oscar", "Isla", "Felix", "Clara", "Elias", "Yuki", "Marco", "Lena", "Diego", "Grace",
    "Samuel", "Alice", "Jonas", "Nora", "Theo", "Maya", "Arthur", "Zoe", "Rafael", "Ines", "Daniel", "Julia", "Omar",
)  # fmt: skip
LAST_NAMES = (
    "Smith", "Martin", "Garcia", "Rossi", "Muller", "Tanaka", "Brown", "Dubois", "Lopez", "Wilson", "Schmidt",
    "Sato", "Taylor", "Bernard", "Moreno", "Ricci", "Becker", "Suzuki", "Clarke", "Laurent", "Romero", "Bianchi",
    "Wagner", "Ito", "Walker", "Petit", "Navarro", "Greco", "Hoffmann", "Kato", "Young", "Fontaine",
)  # fmt: skip
STATUSES = {  # status: share of orders
    "delivered": 0.62, "shipped": 0.13, "processing": 0.07, "pending": 0.05, "cancelled": 0.09, "returned": 0.04,
}  # fmt: skip
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")  # fmt: skip


@dataclass(frozen=True)
class Template:
    """One kind of question: paraphrases and the gold SQL, with {slot} fields (text slots are quoted in the SQL)."""

    name: str
    questions: tuple[str, ...]
    sql: str

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(sorted({f for _, f, _, _ in string.Formatter().parse(self.sql) if f}))


T = Template
TEMPLATES: tuple[Template, ...] = (
    # --- filters on one table
    T("customers_in_city", (
        "List the names of customers who live in {city}.",
        "Which customers are based in {city}?",
        "Show me every customer from {city}.",
        "who are our customers in {city}",
    ), "SELECT name FROM customers WHERE city = '{city}'"),
    T("customers_country_year", (
        "Which customers from {country} signed up in {year}?",
        "List the customers in {country} who joined in {year}.",
        "Names of {country} customers whose signup year is {year}?",
    ), "SELECT name FROM customers WHERE country = '{country}' AND signup_year = {year}"),
    T("products_category_under_price", (
        "Which {category} products cost less than {price} dollars?",
        "List the {category} items priced under ${price}.",
        "Show the {category} products cheaper than {price}.",
    ), "SELECT name FROM products WHERE category = '{category}' AND price < {price}"),
    T("price_of_product", (
        "What is the price of the {product}?",
        "How much does the {product} cost?",
        "Price of {product}?",
        "Tell me what the {product} sells for.",
    ), "SELECT price FROM products WHERE name = '{product}'"),
    # --- counts
    T("count_customers_city", (
        "How many customers live in {city}?",
        "Count the customers from {city}.",
        "What is the number of customers in {city}?",
        "how many of our customers are located in {city}?",
    ), "SELECT COUNT(*) FROM customers WHERE city = '{city}'"),
    T("count_products_over_price", (
        "How many {category} products cost more than {price} dollars?",
        "Count the {category} items priced above ${price}.",
        "Number of products in {category} with a price over {price}?",
    ), "SELECT COUNT(*) FROM products WHERE category = '{category}' AND price > {price}"),
    T("count_orders_status_month", (
        "How many {status} orders were placed in {month} {year}?",
        "Count the orders from {month} {year} with status {status}.",
        "Number of orders placed in {month} {year} that are {status}?",
    ), "SELECT COUNT(*) FROM orders WHERE status = '{status}' "
       "AND order_date BETWEEN '{year}-{month}-01' AND '{year}-{month}-31'"),
    # --- ORDER BY + LIMIT (ties broken, so the rows are unique)
    T("most_expensive_in_category", (
        "What are the {n} most expensive {category} products?",
        "List the top {n} {category} items by price.",
        "Show the {n} priciest products in {category}.",
    ), "SELECT name FROM products WHERE category = '{category}' ORDER BY price DESC, name LIMIT {n}"),
    T("cheapest_in_category_with_price", (
        "List the {n} cheapest {category} products and their prices.",
        "Show the names and prices of the {n} least expensive {category} items.",
        "What are the {n} lowest-priced products in {category}, with prices?",
    ), "SELECT name, price FROM products WHERE category = '{category}' ORDER BY price ASC, name LIMIT {n}"),
    T("recent_orders_of_customer", (
        "Show the {n} most recent orders of {customer}, with their dates.",
        "What are the last {n} orders {customer} placed, and when?",
        "List {customer}'s {n} latest orders and their dates.",
    ), "SELECT o.order_id, o.order_date FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
       "WHERE c.name = '{customer}' ORDER BY o.order_date DESC, o.order_id DESC LIMIT {n}"),
    T("top_customers_in_city", (
        "Who are the {n} customers in {city} with the most orders?",
        "Name the top {n} {city} customers by number of orders.",
        "Which {n} customers from {city} ordered most often?",
    ), "SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.customer_id WHERE c.city = '{city}' "
       "GROUP BY c.customer_id, c.name ORDER BY COUNT(*) DESC, c.name LIMIT {n}"),
    # --- aggregates, GROUP BY, HAVING
    T("customers_per_city_since", (
        "For each city in {country}, how many customers joined in {year} or later?",
        "Count customers per city in {country} with a signup year of at least {year}.",
        "Break down {country} customers who signed up from {year} onwards by city.",
    ), "SELECT city, COUNT(*) FROM customers WHERE country = '{country}' AND signup_year >= {year} GROUP BY city"),
    T("cities_with_many_customers", (
        "Which cities in {country} have more than {k} customers?",
        "List the {country} cities with over {k} customers.",
        "In which cities of {country} do more than {k} of our customers live?",
    ), "SELECT city FROM customers WHERE country = '{country}' GROUP BY city HAVING COUNT(*) > {k}"),
    T("categories_avg_price_above", (
        "Which categories have an average price above {price} dollars?",
        "List the product categories whose mean price exceeds ${price}.",
        "Categories with an average product price over {price}?",
    ), "SELECT category FROM products GROUP BY category HAVING AVG(price) > {price}"),
    T("categories_revenue_above", (
        "Which categories brought in more than {revenue} dollars in {year}?",
        "List the categories with {year} revenue above ${revenue}.",
        "In {year}, which product categories sold for over {revenue} dollars in total?",
    ), "SELECT p.category FROM orders o JOIN products p ON o.product_id = p.product_id "
       "WHERE o.order_date BETWEEN '{year}-01-01' AND '{year}-12-31' "
       "GROUP BY p.category HAVING SUM(o.quantity * p.price) > {revenue}"),
    T("avg_quantity_category_year", (
        "What was the average order quantity for {category} products in {year}?",
        "In {year}, how many units of a {category} product did an order contain on average?",
        "Average quantity per order of {category} items during {year}?",
    ), "SELECT ROUND(AVG(o.quantity), 2) FROM orders o JOIN products p ON o.product_id = p.product_id "
       "WHERE p.category = '{category}' AND o.order_date BETWEEN '{year}-01-01' AND '{year}-12-31'"),
    T("revenue_per_category_month", (
        "What was the revenue of each category in {month} {year}?",
        "Total sales per product category for {month} {year}?",
        "Break down {month} {year} revenue by category.",
    ), "SELECT p.category, ROUND(SUM(o.quantity * p.price), 2) FROM orders o JOIN products p "
       "ON o.product_id = p.product_id WHERE o.order_date BETWEEN '{year}-{month}-01' AND '{year}-{month}-31' "
       "GROUP BY p.category"),
    T("status_counts_city_year", (
        "For customers in {city}, how many orders placed in {year} are there per status?",
        "Break down {year} orders from {city} by status.",
        "Count the {year} orders of {city} customers for each status.",
    ), "SELECT o.status, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
       "WHERE c.city = '{city}' AND o.order_date BETWEEN '{year}-01-01' AND '{year}-12-31' GROUP BY o.status"),
    T("monthly_orders_city_year", (
        "How many orders did customers in {city} place in each month of {year}?",
        "Monthly order counts for {city} in {year}?",
        "Break down {year} orders from {city} by month.",
    ), "SELECT strftime('%m', o.order_date) AS month, COUNT(*) FROM orders o JOIN customers c "
       "ON o.customer_id = c.customer_id WHERE c.city = '{city}' "
       "AND o.order_date BETWEEN '{year}-01-01' AND '{year}-12-31' "
       "GROUP BY month"),
    # --- joins
    T("orders_of_customer", (
        "List the order ids of {customer}.",
        "Which orders did {customer} place?",
        "Show all order numbers for customer {customer}.",
    ), "SELECT o.order_id FROM orders o JOIN customers c ON o.customer_id = c.customer_id WHERE c.name = '{customer}'"),
    T("total_spent_by_customer", (
        "How much has {customer} spent in total?",
        "What is the total amount spent by {customer}?",
        "Total spending of {customer} across all orders?",
    ), "SELECT ROUND(SUM(o.quantity * p.price), 2) FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
       "JOIN products p ON o.product_id = p.product_id WHERE c.name = '{customer}'"),
    T("products_of_customer", (
        "Which products has {customer} ordered?",
        "What did {customer} buy?",
        "List the distinct products purchased by {customer}.",
    ), "SELECT DISTINCT p.name FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
       "JOIN products p ON o.product_id = p.product_id WHERE c.name = '{customer}'"),
    T("customers_of_product", (
        "Which customers ordered the {product}?",
        "Who has bought the {product}?",
        "List the names of customers who purchased {product}.",
    ), "SELECT DISTINCT c.name FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
       "JOIN products p ON o.product_id = p.product_id WHERE p.name = '{product}'"),
    T("big_orders_of_product", (
        "List the ids of orders with more than {qty} units of the {product}.",
        "Which orders contain over {qty} {product} items?",
        "Find orders of the {product} with a quantity above {qty}.",
    ), "SELECT o.order_id FROM orders o JOIN products p ON o.product_id = p.product_id "
       "WHERE p.name = '{product}' AND o.quantity > {qty}"),
    T("product_orders_in_year", (
        "How many times was the {product} ordered in {year}?",
        "Number of {product} orders in {year}?",
        "Count the orders for the {product} placed during {year}.",
    ), "SELECT COUNT(*) FROM orders o JOIN products p ON o.product_id = p.product_id "
       "WHERE p.name = '{product}' AND o.order_date BETWEEN '{year}-01-01' AND '{year}-12-31'"),
    T("units_of_category_in_city", (
        "How many {category} units were sold to customers in {city}?",
        "Total quantity of {category} products ordered from {city}?",
        "How many {category} items did {city} customers buy in total?",
    ), "SELECT SUM(o.quantity) FROM orders o JOIN products p ON o.product_id = p.product_id "
       "JOIN customers c ON o.customer_id = c.customer_id WHERE p.category = '{category}' AND c.city = '{city}'"),
    T("distinct_buyers_category_year", (
        "How many different customers bought {category} products in {year}?",
        "Number of distinct customers with a {category} order in {year}?",
        "Count the unique buyers of {category} items during {year}.",
    ), "SELECT COUNT(DISTINCT o.customer_id) FROM orders o JOIN products p ON o.product_id = p.product_id "
       "WHERE p.category = '{category}' AND o.order_date BETWEEN '{year}-01-01' AND '{year}-12-31'"),
    # --- a subquery
    T("never_ordered_in_city", (
        "Which {category} products have never been ordered by customers in {city}?",
        "List the {category} items nobody from {city} has bought.",
        "What {category} products has no {city} customer ordered?",
    ), "SELECT name FROM products WHERE category = '{category}' AND product_id NOT IN "
       "(SELECT o.product_id FROM orders o JOIN customers c ON o.customer_id = c.customer_id WHERE c.city = '{city}')"),
)  # fmt: skip
del T

Slot = tuple[str, str]  # (as written in the question, as written inside the SQL)


@dataclass(frozen=True)
class SqlDemoPaths(DemoPaths):
    """train: id, question, query; test: id, question; sample_submission and solution: id, query."""

    db: Path  # shop.sqlite


def _build_tables(rng: np.random.Generator) -> dict[str, list[tuple[object, ...]]]:
    """Rows of customers, products and orders: skewed like a real shop (popular cities, products, customers)."""
    city_country = [(city, country) for country, cities in CITIES.items() for city in cities]
    city_weights = rng.dirichlet(np.full(len(city_country), 2.0))
    names = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
    chosen = rng.choice(len(names), N_CUSTOMERS, replace=False)
    cities = rng.choice(len(city_country), N_CUSTOMERS, p=city_weights)
    signup = rng.integers(FIRST_YEAR, LAST_YEAR + 1, N_CUSTOMERS)
    customers = [(i + 1, names[chosen[i]], *city_country[cities[i]], int(signup[i])) for i in range(N_CUSTOMERS)]
    products: list[tuple[object, ...]] = []
    for category, ((low, high), nouns) in CATALOGUE.items():
        for noun in nouns:
            price = math.floor(math.exp(rng.uniform(math.log(low), math.log(high)))) + 0.99
            products.append((len(products) + 1, f"{BRANDS[rng.integers(len(BRANDS))]} {noun}", category, price))

    buyer = rng.choice(N_CUSTOMERS, N_ORDERS, p=rng.dirichlet(np.full(N_CUSTOMERS, 1.5)))
    item = rng.choice(len(products), N_ORDERS, p=rng.dirichlet(np.full(len(products), 3.0)))
    quantity = rng.choice(np.arange(1, 9), N_ORDERS, p=[0.42, 0.24, 0.13, 0.08, 0.05, 0.04, 0.02, 0.02])
    status = rng.choice(list(STATUSES), N_ORDERS, p=list(STATUSES.values()))
    end = dt.date(LAST_YEAR, 12, 31).toordinal()
    start = np.array([dt.date(int(signup[b]), 1, 1).toordinal() for b in buyer])  # no order before signing up
    day = start + (rng.random(N_ORDERS) * (end - start + 1)).astype(np.int64)
    order_rows = sorted(
        zip(day.tolist(), buyer.tolist(), item.tolist(), quantity.tolist(), status.tolist(), strict=True)
    )
    orders = [
        (i + 1, b + 1, p + 1, int(q), dt.date.fromordinal(d).isoformat(), str(s))
        for i, (d, b, p, q, s) in enumerate(order_rows)  # ids follow the dates, like a real order log
    ]
    return {"customers": customers, "products": products, "orders": orders}


def _slot_values(tables: dict[str, list[tuple[object, ...]]]) -> dict[str, list[Slot]]:
    """Every slot's possible values, in a fixed order (sorted), as (question text, SQL text)."""

    def text(values: Iterable[object]) -> list[Slot]:
        return [(v, v.replace("'", "''")) for v in sorted({str(v) for v in values})]  # O'Brien -> 'O''Brien'

    def numbers(values: range) -> list[Slot]:
        return [(str(v), str(v)) for v in values]

    customers, products = tables["customers"], tables["products"]
    return {
        "city": text(c[2] for c in customers),
        "country": text(c[3] for c in customers),
        "customer": text(c[1] for c in customers),
        "category": text(p[2] for p in products),
        "product": text(p[1] for p in products),
        "status": text(STATUSES),
        "year": numbers(range(FIRST_YEAR, LAST_YEAR + 1)),
        "month": [(name, f"{i:02d}") for i, name in enumerate(MONTHS, start=1)],
        "price": numbers(range(10, 205, 5)),  # dollars
        "revenue": numbers(range(500, 10_001, 500)),  # dollars
        "n": numbers(range(2, 11)),  # LIMIT
        "qty": numbers(range(1, 6)),  # units in one order
        "k": numbers(range(3, 25)),  # customers in a city
    }


def split_slot_values(
    values: dict[str, list[Slot]], rng: np.random.Generator
) -> tuple[dict[str, list[Slot]], dict[str, list[Slot]]]:
    """(train, test) pools: a random ``TEST_SHARE`` of each slot's values (at least one) is held out for test."""
    train, test = {}, {}
    for slot in sorted(values):
        pool = values[slot]
        n_test = max(1, math.ceil(TEST_SHARE * len(pool)))
        order = rng.permutation(len(pool))
        test[slot] = [pool[i] for i in sorted(order[:n_test])]
        train[slot] = [pool[i] for i in sorted(order[n_test:])]
    return train, test


def _answers(conn: sqlite3.Connection, query: str) -> bool:
    rows = conn.execute(query).fetchall()  # a template's SQL that fails is a bug here: let it raise
    return any(value is not None for row in rows for value in row)


def _draw_pairs(
    conn: sqlite3.Connection,
    pools: dict[str, list[Slot]],
    n: int,
    rng: np.random.Generator,
    exclude: frozenset[str] = frozenset(),
) -> list[tuple[str, str]]:
    """``n`` (question, query) pairs, the templates in turn; each query answers something, questions repeat only
    when a template's slot pools run out of new ones, and no question or query is one of ``exclude``."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set(exclude)
    answers: dict[str, bool] = {}
    exhausted: set[str] = set()  # templates whose every question is excluded (few slot values, all asked in train)
    turn = 0
    while len(pairs) < n:
        template = TEMPLATES[turn % len(TEMPLATES)]
        turn += 1
        if template.name in exhausted:
            if len(exhausted) == len(TEMPLATES):
                raise RuntimeError("every template's questions are all excluded: fewer test rows, or split='values'")
            continue
        found: tuple[str, str] | None = None
        for _ in range(_TRIES):
            chosen = {slot: pools[slot][rng.integers(len(pools[slot]))] for slot in template.slots}
            wording = template.questions[rng.integers(len(template.questions))]
            question = wording.format(**{slot: value[0] for slot, value in chosen.items()})
            if (found is not None and question in seen) or question in exclude:
                continue
            query = template.sql.format(**{slot: value[1] for slot, value in chosen.items()})
            if query in exclude:
                continue
            if query not in answers:
                answers[query] = _answers(conn, query)
            if answers[query]:
                found = (question, query)
                if question not in seen:
                    break
        if exclude and (found is None or found[0] in seen):  # test rows: unique, and never a training pair
            exhausted.add(template.name)
            continue
        if found is None:
            raise RuntimeError(f"template {template.name!r}: no slot values with an answer in {_TRIES} draws")
        seen.add(found[0])
        pairs.append(found)
    return pairs


def _build_database(
    root: Path, seed: int, n_train: int, n_test: int, split: Split
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Write shop.sqlite atomically (built in a temporary sibling, then renamed) and draw the pairs from it."""
    rng = np.random.default_rng([seed, 2])
    tables = _build_tables(rng)
    train_pools, test_pools = split_slot_values(_slot_values(tables), rng)
    if split == "questions":
        train_pools = test_pools = _slot_values(tables)
    fd, tmp_name = tempfile.mkstemp(dir=root, prefix=f".{DB_FILE}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        conn = sqlite3.connect(tmp)
        try:
            conn.executescript(SCHEMA)
            for table, rows in tables.items():
                conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
            conn.commit()
            train = _draw_pairs(conn, train_pools, n_train, rng)
            test = _draw_pairs(conn, test_pools, n_test, rng, exclude=frozenset(x for pair in train for x in pair))
        finally:
            conn.close()
        fsync_file(tmp)
        os.replace(tmp, root / DB_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(root)
    return train, test


def make_sql_demo(
    dir: str | Path,
    *,
    seed: int = 0,
    n_train: int = 1500,
    n_test: int = 300,
    split: Split = "questions",
    force: bool = False,
    test_fraction: float | None = None,  # unused: the test rows are n_test (the CLI passes it to every demo)
) -> SqlDemoPaths:
    """Write shop.sqlite, train.csv, test.csv, sample_submission.csv and solution.csv into ``dir`` (~0.3 s;
    deterministic for ``seed``). A folder holding a user's own files is refused unless ``force``.

    ``split``: "questions" (default): no test question or query is in train (each asks for a combination training
    never did); the shop's cities, products and years all appear in training, as in a competition over one
    database. "values": a share of every slot's values
    (TEST_SHARE) only in test, so a model must copy names it never generated: a tiny model trained from scratch,
    with no copy mechanism, gets the structure right and the names wrong (record F1 0.07 where "questions" gives
    far more: README)."""
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be positive, got {n_train} and {n_test}")
    given = parameters(Path(dir))
    root = prepare_demo_dir(dir, force, {"task": "seq2seq", "metric": given["metric"], "parameters": given})
    write_atomic(root / METRIC_FILE, Path(__file__).with_name(METRIC_FILE).read_text())  # as the user downloads it
    train_pairs, test_pairs = _build_database(root, seed, n_train, n_test, split)
    # Random ids over all rows, files sorted by id: neither the order nor the ids reveal the template or the split.
    ids = np.random.default_rng([seed, 1]).permutation(n_train + n_test)
    frame = pd.DataFrame(train_pairs + test_pairs, columns=["question", "query"]).assign(id=ids)
    train, test = frame.iloc[:n_train].sort_values("id"), frame.iloc[n_train:].sort_values("id")
    paths = SqlDemoPaths(
        root, root / "train.csv", root / "test.csv", root / "sample_submission.csv", root / "solution.csv",
        db=root / DB_FILE,
    )  # fmt: skip
    write_csv(train[["id", "question", "query"]], paths.train)
    write_csv(test[["id", "question"]], paths.test)
    write_csv(test[["id"]].assign(query=PLACEHOLDER_QUERY), paths.sample_submission)
    write_csv(test[["id", "query"]], paths.solution)
    return paths


def parameters(root: Path) -> dict[str, str]:
    """00's parameters for the demo in ``root``: a relative metric file is looked up beside the notebook, so the demo
    names its copy of sql_metric.py by full path."""
    return {**PARAMETERS, "metric": f"{(root / METRIC_FILE).resolve()}:record_f1"}


def score_sql(solution_csv: str | Path, submission_csv: str | Path, db: str | Path) -> float:
    """Mean record F1 of a submission (id, query) against the solution, executing both on ``db`` read-only.
    Mismatched ids or row counts raise a DataError; a blank or failing query scores 0 for its row."""
    merged = read_matched(solution_csv, submission_csv, "query", text=True)
    return mean_record_f1(merged["query_pred"].tolist(), merged["query_true"].tolist(), db)


def most_common_query(train_csv: str | Path) -> str:
    """The training query seen most often (ties: the alphabetically first): the trivial baseline's one answer,
    by 02's rule (kitlib.tasks.baseline.most_common)."""
    return str(most_common(pd.read_csv(train_csv, dtype={"query": str}, keep_default_na=False)["query"]))


def baseline_f1(paths: SqlDemoPaths) -> float:
    """Mean record F1 on the test rows of the trivial baseline: the most common training query for every row."""
    solution = read_scored(paths.solution, "solution", "query", text=True)
    query = most_common_query(paths.train)
    return mean_record_f1([query] * len(solution), solution["query"].tolist(), paths.db)

-- The demo agent's shared database (config/demo/shop.sqlite, read-only to the agent as `shop`).
-- Rebuild it after editing this file:
--   rm -f config/demo/shop.sqlite && python3 -c "import sqlite3; sqlite3.connect('config/demo/shop.sqlite').executescript(open('config/demo/shop.sql').read())"
CREATE TABLE products (
    sku TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    price_eur REAL NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    day TEXT NOT NULL,
    region TEXT NOT NULL,
    sku TEXT NOT NULL REFERENCES products (sku),
    quantity INTEGER NOT NULL
);
INSERT INTO products VALUES
    ('MUG-01', 'Coffee mug', 9.5),
    ('TEE-02', 'T-shirt', 19.0),
    ('CAP-03', 'Cap', 14.0),
    ('BAG-04', 'Tote bag', 12.5);
INSERT INTO orders (day, region, sku, quantity) VALUES
    ('2026-11-02', 'north', 'MUG-01', 3),
    ('2026-11-02', 'south', 'TEE-02', 1),
    ('2026-11-03', 'east', 'CAP-03', 2),
    ('2026-11-04', 'north', 'TEE-02', 2),
    ('2026-11-05', 'west', 'BAG-04', 4),
    ('2026-11-06', 'south', 'MUG-01', 6),
    ('2026-11-07', 'east', 'TEE-02', 1),
    ('2026-11-08', 'north', 'BAG-04', 1),
    ('2026-11-09', 'west', 'CAP-03', 3),
    ('2026-11-10', 'south', 'CAP-03', 2),
    ('2026-11-11', 'north', 'MUG-01', 2),
    ('2026-11-12', 'east', 'BAG-04', 5);

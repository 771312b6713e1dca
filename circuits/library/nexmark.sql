-- The demo's four Nexmark views, as Spark Declarative Pipelines statements over the
-- inputs persons, auctions and bids (schemas in circuits/library/nexmark.py).

-- Revenue and number of bids per auction category.
CREATE MATERIALIZED VIEW bids_by_category AS
SELECT a.category, sum(b.price) AS revenue, count(*) AS bids
FROM bids b JOIN auctions a ON b.auction = a.id
GROUP BY a.category;

-- Nexmark q3, local item suggestion: sellers in OR, ID or CA of auctions in category 10.
CREATE MATERIALIZED VIEW q3 AS
SELECT p.name, p.city, p.state, a.id
FROM auctions a JOIN persons p ON a.seller = p.id
WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA');

-- Nexmark q4, the average closing price per category: each auction's highest bid while open.
CREATE TEMPORARY VIEW finals AS
SELECT a.id, a.category, max(b.price) AS final
FROM auctions a JOIN bids b ON a.id = b.auction
WHERE b.date_time BETWEEN a.date_time AND a.expires
GROUP BY a.id, a.category;

CREATE MATERIALIZED VIEW q4 AS
SELECT category, avg(final) AS avg_final FROM finals GROUP BY category;

-- A q15-style count-distinct: per day, bids, distinct bidders and distinct auctions.
CREATE MATERIALIZED VIEW q15 AS
SELECT date_format(timestamp_millis(date_time), 'yyyy-MM-dd') AS day, count(*) AS total_bids,
       count(DISTINCT bidder) AS total_bidders, count(DISTINCT auction) AS total_auctions
FROM bids GROUP BY 1;

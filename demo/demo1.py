import csv, json, platform
rows = list(csv.DictReader(open("/tmp/demo/sales.csv")))
revenue = sum(int(r["revenue"]) for r in rows)
profit = revenue - sum(int(r["cost"]) for r in rows)
summary = {"rows": len(rows), "revenue": revenue, "profit": profit}
json.dump(summary, open("/tmp/demo/summary.json", "w"))
print(json.dumps(summary))
print(platform.system())

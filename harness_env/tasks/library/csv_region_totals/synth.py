"""Input synthesis: fresh sales rows; the expected totals are recomputed so the checker stays consistent."""
import json
import re


def mutate(rng, task_dir):
    regions = rng.sample(["north", "south", "east", "west", "central"], k=rng.randint(2, 4))
    rows = [(rng.choice(regions), round(rng.uniform(1, 100), 2)) for _ in range(rng.randint(4, 12))]
    totals = {}
    for region, amount in rows:
        totals[region] = round(totals.get(region, 0.0) + amount, 2)
    lines = ["region,amount"] + [f"{r},{a}" for r, a in rows]
    (task_dir / "input_files" / "sales.csv").write_text("\n".join(lines) + "\n")
    check = task_dir / "reward" / "check.py"
    check.write_text(re.sub(r"^EXPECTED = .*$", f"EXPECTED = {json.dumps(totals)}", check.read_text(), count=1,
                            flags=re.M))
    return {"rows": len(rows), "regions": sorted(totals)}

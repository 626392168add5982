"""How scaling.json here was put together (run from this folder): this session's study plus the points of the
previous one (../2026-12-01-h200-scaling2-smollm2/scaling.json) that this one did not train again.

Both sessions wrote their 102,393-conversation pool with the same seeded commands and got the same pool: the same
filter counts (10,993 filtered, 260 exact and 365 near duplicates, 96,382 kept), the same held-out prompt sets
(sha256 fa23e0c29452... chitchat, 877b37148e26... target-written), and the 5-layer point trained in both sessions
evaluated to the same figures to the last digit (chitchat tau 2.7513 [2.4645, 3.0240], self 2.0803, general 1.7327).
So their points are one study on one pool ("102k"); the previous session's 30k point came from a second, smaller
pool ("30k": --n 26000, 23% chitchat instead of 6.8%) and keeps that label.
"""

import gzip
import json

now = json.load(gzip.open("scaling.device.json.gz"))  # as the device wrote it (call 4)
before = json.load(open("../2026-12-01-h200-scaling2-smollm2/scaling.json"))
mine = {p["name"] for p in now["points"] if p["status"] == "finished"}
points = [{**p, "pool": "102k", "session": "2026-12-01 (3)"} for p in now["points"] if p["status"] == "finished"]
for p in before["points"]:
    if p["name"] in mine or not p.get("evals"):
        continue  # trained again here (or never evaluated there: killed at that call's limit)
    points.append({**p, "session": "2026-12-01 (2)"})
order = {"steps": 0, "epochs": 1, "depth": 2, "variant": 3}
points.sort(key=lambda p: (order.get(p["series"], 9), p["conversations"], p["steps"], p["name"]))
merged = {**now, "points": points, "wall_s": now.get("wall_s", 0) + before.get("wall_s", 0),
          "note": "two sessions on the same pool merged (merge.py); steps-n30000-d3 is from the 30k pool"}
json.dump(merged, open("scaling.json", "w"), indent=1)
print({p["name"]: (p["pool"], p["session"]) for p in points})

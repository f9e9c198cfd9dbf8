"""Input synthesis: new file names and sizes in data/; the expected answer is rewritten to match."""
import re


def mutate(rng, task_dir):
    data = task_dir / "input_files" / "data"
    for f in data.iterdir():
        f.unlink()
    names = rng.sample(["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa"], k=rng.randint(3, 5))
    sizes = rng.sample(range(50, 5000), k=len(names))  # distinct: exactly one largest
    for name, size in zip(names, sizes):
        (data / f"{name}.log").write_text("x" * size + "\n")
    largest = names[sizes.index(max(sizes))] + ".log"
    check = task_dir / "reward" / "check.py"
    check.write_text(re.sub(r"^EXPECTED = .*$", f"EXPECTED = {largest!r}", check.read_text(), count=1, flags=re.M))
    return {"files": len(names), "largest": largest}

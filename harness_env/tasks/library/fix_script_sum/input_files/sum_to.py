import sys

n = int(sys.argv[1])
total = 0
for i in range(1, n):
    total += i
print(total)

#!/bin/bash
set -eu
sed -i 's/colour/color/g' doc.txt

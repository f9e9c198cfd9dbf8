#!/bin/bash
set -eu
mkdir -p text images
mv *.txt text/
mv *.jpg *.png images/

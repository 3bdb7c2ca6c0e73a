module github.com/dsec-dev/dsec

go 1.26.8
